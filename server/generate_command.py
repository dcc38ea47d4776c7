"""`argosy generate`: one prompt through the offline engine, printed."""
from __future__ import annotations

import argparse

from argosy.server.engine_args import add_engine_args, config_from_args


def add_generate_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--sampling-seed", type=int, default=None)
    add_engine_args(parser)


def generate(args: argparse.Namespace) -> int:
    from argosy.server.llm import LLM
    from argosy.server.sampling_params import SamplingParams

    config = config_from_args(args)
    llm = LLM(**vars(config))
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.sampling_seed)
    if args.chat:
        outputs = llm.chat([{"role": "user", "content": args.prompt}], params)
    else:
        outputs = llm.generate(args.prompt, params)
    print(outputs[0].outputs[0].text)
    return 0
