"""`argosy operator`: runs the kopf operator, in all namespaces or a list of them, with
kopf peering so that several replicas never act twice, and a liveness endpoint."""
from __future__ import annotations

import argparse
import logging

LOG_FORMATS = {"json": "JSON", "plain": "PLAIN", "full": "FULL"}


def add_operator_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="watch this namespace (repeatable); default: all namespaces")
    parser.add_argument("--peering", default="argosy",
                        help="kopf peering name: replicas sharing it elect one active operator")
    parser.add_argument("--standalone", action="store_true",
                        help="no peering (a single replica, or no kopf peering CRDs installed)")
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
             peering_name=args.peering, liveness_endpoint=args.liveness or None)
    return 0
