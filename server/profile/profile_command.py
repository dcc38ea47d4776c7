"""`argosy profile`: times the engine's steps on this machine, fits the step-time model and writes
the profile (`--output`) that `argosy simulate` runs replicas on. Takes the engine flags of
`argosy serve`, which the profile records: profile the engine as it will be served."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from argosy.flags import add_flags, config_from_args, setting
from argosy.server.engine_config import EngineConfig


@dataclass
class ProfileOptions:
    output: str = setting("profile.json", "where the profile is written")
    quick: bool = setting(False, "a few steps of each kind only (a smoke test, not a profile to trust)")


def add_profile_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, ProfileOptions)
    add_flags(parser.add_argument_group("engine"), EngineConfig)


def profile(args: argparse.Namespace) -> int:
    import torch

    from argosy.server.engine.engine_core import EngineCore
    from argosy.server.profile.engine_profile import EngineProfile, EngineSettings, fit_coefficients
    from argosy.server.profile.machine import cpu_line
    from argosy.server.profile.step_shape import FEATURES
    from argosy.server.profile.workloads import FULL, QUICK, ProfileRun

    options = config_from_args(ProfileOptions, args)
    config = config_from_args(EngineConfig, args)
    core = EngineCore(config)
    try:
        run = ProfileRun(core)
        run.run(QUICK if options.quick else FULL, lambda what: print(f"timing {what}", flush=True))
    finally:
        core.shutdown()
    coefficients, quality = fit_coefficients(run.samples)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_line()
    limits = core.limits
    result = EngineProfile(
        machine=f"{device}; {torch.get_num_threads()} threads",
        settings=EngineSettings(
            model=str(core.model_config.path),
            startup=core.device.startup,
            block_size=config.block_size,
            num_blocks=core.kv.num_blocks,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            max_model_len=limits.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            enable_prefix_caching=config.enable_prefix_caching,
        ),
        coefficients=coefficients,
        fit=quality,
        samples=[[*shape.features(), seconds] for shape, seconds in run.samples],
    )
    result.save(options.output)
    print(f"\n{result.machine}\n{'feature':<20}{'µs per unit':>14}")
    for name in FEATURES:
        print(f"{name:<20}{coefficients[name] * 1e6:>14.3f}")
    print(
        f"{quality.steps} steps; relative error of the fit: median {quality.median_relative_error:.1%}, "
        f"p90 {quality.p90_relative_error:.1%}\nwritten to {options.output}"
    )
    return 0
