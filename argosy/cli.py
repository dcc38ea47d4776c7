"""The `argosy` command: `argosy serve`, `argosy operator`, `argosy agent`, `argosy kv-events`, `argosy generate`,
`argosy profile`, `argosy simulate`.

Only the chosen verb's module is imported, so that `argosy operator` never loads torch."""

from __future__ import annotations

import argparse
import importlib
import sys

# verb -> (help, module, function adding its flags, function running it)
VERBS = {
    "serve": ("run the OpenAI-compatible HTTP server", "argosy.server.api.serve_command", "add_serve_args", "serve"),
    "operator": ("run the Kubernetes operator", "argosy.operator.main", "add_operator_args", "run"),
    "agent": (
        "run a node's model-cache agent, or print a folder's manifest (agent manifest FOLDER)",
        "argosy.operator.model_cache.agent.main",
        "add_agent_args",
        "run",
    ),
    "kv-events": (
        "print a replica's KV-cache events; with --check URL --prompt TEXT, check they carry the hashes expected",
        "argosy.server.kv_events.inspect_command",
        "add_kv_events_args",
        "run",
    ),
    "profile": (
        "time the engine's steps on this machine and write the profile argosy simulate runs on",
        "argosy.server.profile.profile_command",
        "add_profile_args",
        "profile",
    ),
    "simulate": (
        "simulate a service's fleet under a trace on the engine's profile: figures, summary.json and plots",
        "argosy.simulator.simulate_command",
        "add_simulate_args",
        "simulate",
    ),
    "generate": (
        "complete one prompt offline and print the text",
        "argosy.server.generate_command",
        "add_generate_args",
        "generate",
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = argv[0] if argv and argv[0] in VERBS else None
    if chosen in ("serve", "generate", "profile"):
        from argosy.kernels.interpreter import use_interpreter_without_cuda

        use_interpreter_without_cuda()  # before a checkpoint conversion can import triton
    parser = argparse.ArgumentParser(prog="argosy", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb, (help_text, module, add_args, run) in VERBS.items():
        sub = verbs.add_parser(verb, help=help_text)
        if verb == chosen:
            loaded = importlib.import_module(module)
            getattr(loaded, add_args)(sub)
            sub.set_defaults(run=getattr(loaded, run))
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
