"""What publishing KV events costs a step, and that a subscriber which stops reading costs nothing
more: the offline engine (the embedded default model) on the same prefix-heavy batch, with events
off, on with a subscriber that reads everything, and on with one that never reads; output tokens/s
of each, interleaved over --repeats rounds, the median and the ratio to events off.

    python bench/kv_events.py [--prompts 48] [--max-tokens 32] [--repeats 3]"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

import zmq

from argosy import LLM, SamplingParams
from argosy.server.profile.machine import cpu_line

CASES = ("off", "read", "stalled")


def prompts(count: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(1000, vocab) for _ in range(256)]  # every prompt's first 16 blocks
    return [shared + [rng.randrange(1000, vocab) for _ in range(64 + 16 * (i % 8))] for i in range(count)]


def reader(endpoint: str, stop: threading.Event, stalled: bool) -> None:
    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.set_hwm(10)  # a stalled subscriber's buffer fills at once
    socket.connect(endpoint)
    while not stop.is_set():
        if stalled:
            time.sleep(0.05)
        elif socket.poll(50):
            socket.recv_multipart()
    socket.close(linger=0)
    context.term()


def run(llm: LLM, batch: list[list[int]], max_tokens: int) -> float:
    llm.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params)
    return sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    events = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*", "max_queue_size": 64, "hwm": 10}
    engines = {"off": LLM(kv_cache_memory=256 << 20), "on": LLM(kv_cache_memory=256 << 20, kv_events_config=events)}
    batch = prompts(args.prompts, engines["off"].engine.core.model_config.vocab_size)
    endpoint = engines["on"].engine.core.kv_events.bound_endpoints[0]
    for llm in engines.values():
        run(llm, batch[:4], 4)  # warm-up
    speeds: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(args.repeats):
        for case in CASES:
            stop = threading.Event()
            subscriber = None
            if case != "off":
                subscriber = threading.Thread(target=reader, args=(endpoint, stop, case == "stalled"))
                subscriber.start()
                time.sleep(0.2)
            speeds[case].append(run(engines["off" if case == "off" else "on"], batch, args.max_tokens))
            stop.set()
            if subscriber is not None:
                subscriber.join()
    publisher = engines["on"].engine.core.kv_events
    base = statistics.median(speeds["off"])
    print(f"CPU: {cpu_line()}; {args.prompts} prompts sharing 256 tokens, {args.max_tokens} tokens out each")
    print("| KV events | tokens/s (median) | min | max | ratio to off |")
    print("|---|---|---|---|---|")
    for case in CASES:
        values = speeds[case]
        label = {"off": "off", "read": "on, subscriber reading", "stalled": "on, subscriber stalled"}[case]
        print(f"| {label} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} | "
              f"{statistics.median(values) / base:.3f} |")  # fmt: skip
    print(f"batches published {publisher.published}, dropped (queue full) {publisher.dropped}")


if __name__ == "__main__":
    main()
