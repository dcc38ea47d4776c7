"""`argosy operator`'s command line, and the chart's operator arguments it must accept."""

from __future__ import annotations

import argparse
import subprocess
import sys

from argosy.operator.main import add_operator_args, peering_priority


def parse(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_operator_args(parser)
    return parser.parse_args(list(args))


def test_defaults_watch_all_namespaces_with_peering():
    args = parse()
    assert args.namespace == [] and args.peering == "argosy" and not args.standalone
    assert args.liveness == "http://0.0.0.0:8080/healthz" and args.log_format == "json"


def test_flags():
    args = parse("--namespace=llm", "-n", "batch", "--standalone", "--log-format=plain", "--priority=7")
    assert args.namespace == ["llm", "batch"] and args.standalone and args.log_format == "plain"
    assert peering_priority(args.priority) == 7


def test_replicas_get_distinct_positive_priorities():
    names = [f"argosy-7c9d8f6b5d-{suffix}" for suffix in ("x2k4p", "q8z1m", "b7c3d", "zz9qa")]
    priorities = [peering_priority(None, name) for name in names]
    assert len(set(priorities)) == len(names) and all(p > 0 for p in priorities)
    assert peering_priority(None, names[0]) == priorities[0]  # stable for one pod


def test_the_operator_never_loads_torch():
    code = (
        "import sys, argosy.operator.handlers, argosy.operator.crd, argosy.operator.main;"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-P", "-c", code], check=True)
