"""`argosy agent`: the node's model-cache agent (a DaemonSet pod per node), and
`argosy agent manifest FOLDER`, which prints a folder's manifest for a ModelCache's source."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from argosy.flags import add_flags, config_from_args, setting
from argosy.operator.model_cache.nodes import AGENT_ADDRESS, DEFAULT_CACHE_ROOT

_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


@dataclass
class AgentOptions:
    node_name: str = setting("", "the node this agent runs on", env="NODE_NAME")
    cache_root: str = setting(DEFAULT_CACHE_ROOT, "the node's folder for copies (the same on every node)")
    quota: str = setting("0", "most bytes the copies may take, as a Kubernetes quantity (500Gi); 0: no quota")
    library_root: str = setting("/libraries", "where the library claims are mounted, one folder per claim")
    parallel_copies: int = setting(2, "copies under way at once")
    interval: float = setting(5.0, "seconds between passes")
    port: int = setting(8090, "port serving this node's copies to other nodes' agents (0: off)")
    pod_ip: str = setting("", "this pod's address, which other agents copy from", env="POD_IP")


def parse_quantity(text: str) -> int:
    """A Kubernetes quantity of bytes: 500Gi, 1T, 2000000."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([kMGT]i?|)", text.strip())
    if found is None:
        raise ValueError(f"--quota {text!r} is not a quantity of bytes such as 500Gi")
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def add_agent_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, AgentOptions)
    parser.add_argument("action", nargs="?", choices=["run", "manifest"], default="run")
    parser.add_argument("folder", nargs="?", help="with manifest: the folder to describe")


def run(args: argparse.Namespace) -> int:
    if args.action == "manifest":
        from argosy.operator.model_cache.agent.manifest import folder_manifest

        if not args.folder or not Path(args.folder).is_dir():
            print("argosy agent manifest FOLDER: FOLDER must be a folder", file=sys.stderr)
            return 2
        print(folder_manifest(Path(args.folder)).to_json())
        return 0
    return serve(config_from_args(AgentOptions, args))


def serve(options: AgentOptions) -> int:
    from argosy.operator.kinds import NODE
    from argosy.operator.kube import KubeClient
    from argosy.operator.model_cache.agent.agent import Agent, AgentConfig
    from argosy.operator.model_cache.agent.file_server import FileServer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not options.node_name:
        print("argosy agent needs --node-name (or $NODE_NAME)", file=sys.stderr)
        return 2
    kube = KubeClient.from_environment()
    config = AgentConfig(
        options.node_name,
        Path(options.cache_root),
        parse_quantity(options.quota),
        Path(options.library_root),
        options.parallel_copies,
    )
    agent = Agent(kube, config)
    server = FileServer(config.cache_root, port=options.port).start() if options.port else None
    if server is not None and options.pod_ip:
        annotation = {AGENT_ADDRESS: f"{options.pod_ip}:{server.port}"}
        kube.patch(NODE, None, options.node_name, {"metadata": {"annotations": annotation}})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set():
            try:
                agent.run_once()
            except Exception:  # the API server or the disk: logged, and the next pass tries again
                logging.getLogger("argosy.agent").exception("pass failed")
            stop.wait(options.interval)
    except KeyboardInterrupt:
        pass
    finally:
        agent.close()
        if server is not None:
            server.close()
    return 0
