"""The `argosy` command."""
from __future__ import annotations

import argparse
import os
import sys


def _generate(args: argparse.Namespace) -> int:
    from argosy.server.engine import LLMEngine
    from argosy.server.engine_args import config_from_args
    from argosy.server.llm import LLM
    from argosy.server.sampling_params import SamplingParams

    llm = LLM.__new__(LLM)
    llm.engine, llm._next_id = LLMEngine(config_from_args(args)), 0
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.sampling_seed)
    if args.chat:
        outputs = llm.chat([{"role": "user", "content": args.prompt}], params)
    else:
        outputs = llm.generate(args.prompt, params)
    print(outputs[0].outputs[0].text)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from argosy.server.api.serve import serve

    return serve(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        # OpenMP threads that spin between the engine's kernels would starve the HTTP event
        # loop of CPU; sleeping threads cost some offline throughput but keep the API responsive.
        # It must be set before torch loads OpenMP.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from argosy.server.api.serve import add_serve_args
    from argosy.server.engine_args import add_engine_args

    parser = argparse.ArgumentParser(prog="argosy", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    srv = verbs.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    add_serve_args(srv)
    srv.set_defaults(run=_serve)
    gen = verbs.add_parser("generate", help="complete one prompt offline and print the text")
    gen.add_argument("prompt")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--sampling-seed", type=int, default=None)
    add_engine_args(gen)
    gen.set_defaults(run=_generate)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
