"""Host overhead of a decode step: schedule, input preparation, sampling and output processing
(detokenization and stop checks included), with the model's forward pass replaced by a no-op
that returns logits of the right shape. What is left is what the host adds to every step.

    python bench/overhead.py [--batches 1 16 64 256] [--steps 32] [--repeats 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from argosy import LLM, SamplingParams
from argosy.server.sampling_params import RequestOutputKind

PROMPT_LEN = 32


def host_step_seconds(llm: LLM, batch: int, steps: int, kind: RequestOutputKind) -> float:
    """Median wall time of `steps` decode steps of `batch` sequences, after their prefill."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True, output_kind=kind)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", [100 + (i + j) % 1000 for j in range(PROMPT_LEN)], params)
    while any(s.num_output_tokens == 0 for s in engine.core.scheduler.running) or engine.core.scheduler.waiting:
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    for request_id in list(engine.requests):
        engine.abort(request_id)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded model)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(args.model, max_num_seqs=max(args.batches), enable_prefix_caching=False)
    vocab = llm.engine.core.model_config.vocab_size
    # Logits that always pick an ordinary token (1000), so detokenization does real work.
    logits = torch.randn(max(args.batches), vocab).to(llm.engine.core.executor.worker.runner.dtype)
    logits[:, 1000] += 100.0
    llm.engine.core.executor.worker.runner.forward = lambda inputs, kv_cache: logits[: len(inputs.logits_rows)]
    print(f"\nhost time per decode step, forward pass a no-op, {torch.get_num_threads()} threads")
    print("outputs as `LLM.generate` takes them (final only), and as a stream takes them (a delta every step)")
    print("| batch | µs per step | µs per sequence | µs per sequence, deltas |\n|--:|--:|--:|--:|")
    for batch in args.batches:
        # The best of a few runs, as timeit reports: noise from this machine's neighbours only adds.
        final = min(
            host_step_seconds(llm, batch, args.steps, RequestOutputKind.FINAL_ONLY) for _ in range(args.repeats)
        )
        delta = min(host_step_seconds(llm, batch, args.steps, RequestOutputKind.DELTA) for _ in range(args.repeats))
        print(f"| {batch} | {final * 1e6:.0f} | {final * 1e6 / batch:.1f} | {delta * 1e6 / batch:.1f} |")


if __name__ == "__main__":
    main()
