"""`argosy operator`: runs the kopf operator, in all namespaces or a list of them, with
kopf peering so that several replicas never act twice, and a liveness endpoint.

kopf peering is not leader election: replicas of equal priority all pause. So each replica
takes a priority of its own, derived from its pod name; the highest acts, the others stand by
and take over once its peering record expires (60 s after it stops)."""

from __future__ import annotations

import argparse
import logging
import socket
import zlib
from dataclasses import dataclass
from typing import Literal

from argosy.flags import add_flags, config_from_args, setting
from argosy.operator.model_cache.nodes import DEFAULT_CACHE_ROOT


@dataclass
class OperatorOptions:
    namespace: list[str] = setting([], "watch this namespace; default: all namespaces", short="-n")
    peering: str = setting("argosy", "kopf peering name: replicas sharing it elect one active operator")
    standalone: bool = setting(False, "no peering (a single replica, or no kopf peering CRDs installed)")
    priority: int | None = setting(None, "peering priority; default: derived from the pod name, distinct per replica")
    liveness: str = setting("http://0.0.0.0:8080/healthz", "URL of the liveness endpoint ('' to disable)")
    log_format: Literal["json", "plain", "full"] = setting("json", "kopf's log format")
    verbose: bool = setting(False, "debug logging")
    cache_root: str = setting(
        DEFAULT_CACHE_ROOT, "the nodes' model-cache folder, as the agents keep it (the same on every node)"
    )


def add_operator_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, OperatorOptions)


def run(args: argparse.Namespace) -> int:
    import kopf

    import argosy.operator.handlers  # noqa: F401  (registers the handlers)

    options = config_from_args(OperatorOptions, args)
    kopf.configure(verbose=options.verbose, log_format=kopf.LogFormat[options.log_format.upper()])
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    kopf.run(
        clusterwide=not options.namespace,
        namespaces=options.namespace or None,
        standalone=options.standalone,
        peering_name=options.peering,
        priority=peering_priority(options.priority),
        liveness_endpoint=options.liveness or None,
        memo=kopf.Memo(cache_root=options.cache_root),
    )
    return 0


def peering_priority(given: int | None, identity: str | None = None) -> int:
    """A priority that differs between replicas (a hash of the pod's host name)."""
    if given is not None:
        return given
    return zlib.crc32((identity or socket.gethostname()).encode()) % (2**31 - 1) + 1
