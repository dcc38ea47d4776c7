"""`argosy generate`: one prompt through the offline engine, printed."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from argosy.flags import add_flags, config_from_args, setting
from argosy.server.engine_config import EngineConfig


@dataclass
class GenerateOptions:
    prompt: str = setting("", "the prompt", positional=True)
    chat: bool = setting(False, "wrap the prompt in the model's chat template")
    temperature: float = setting(0.0, "0 is greedy")
    max_tokens: int = setting(128, "most tokens to generate")
    sampling_seed: int | None = setting(None, "seed of this request's sampling")


def add_generate_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, GenerateOptions)
    add_flags(parser.add_argument_group("engine"), EngineConfig)


def generate(args: argparse.Namespace) -> int:
    from argosy.server.llm import LLM
    from argosy.server.sampling_params import SamplingParams

    options = config_from_args(GenerateOptions, args)
    llm = LLM(**vars(config_from_args(EngineConfig, args)))
    params = SamplingParams(temperature=options.temperature, max_tokens=options.max_tokens, seed=options.sampling_seed)
    if options.chat:
        outputs = llm.chat([{"role": "user", "content": options.prompt}], params)
    else:
        outputs = llm.generate(options.prompt, params)
    print(outputs[0].outputs[0].text)
    return 0
