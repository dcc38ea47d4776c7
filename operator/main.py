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

LOG_FORMATS = {"json": "JSON", "plain": "PLAIN", "full": "FULL"}


def add_operator_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="watch this namespace (repeatable); default: all namespaces")
    parser.add_argument("--peering", default="argosy",
                        help="kopf peering name: replicas sharing it elect one active operator")
    parser.add_argument("--standalone", action="store_true",
                        help="no peering (a single replica, or no kopf peering CRDs installed)")
    parser.add_argument("--priority", type=int, default=None,
                        help="peering priority (default: derived from the pod name, distinct per replica)")
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                        help="URL of the liveness endpoint ('' to disable)")
    parser.add_argument("--log-format", choices=sorted(LOG_FORMATS), default="json")
    parser.add_argument("--verbose", action="store_true")


def run(args: argparse.Namespace) -> int:
    import kopf

    import argosy.operator.handlers  # noqa: F401  (registers the handlers)

    kopf.configure(verbose=args.verbose, log_format=getattr(kopf.LogFormat, LOG_FORMATS[args.log_format]))
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    kopf.run(clusterwide=not args.namespace, namespaces=args.namespace or None, standalone=args.standalone,
             peering_name=args.peering, priority=peering_priority(args.priority), liveness_endpoint=args.liveness or None)
    return 0


def peering_priority(given: int | None, identity: str | None = None) -> int:
    """A priority that differs between replicas (a hash of the pod's host name)."""
    if given is not None:
        return given
    return zlib.crc32((identity or socket.gethostname()).encode()) % (2 ** 31 - 1) + 1
