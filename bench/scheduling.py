"""Scheduling under pressure, side by side in one run, on the offline engine with the default
model and requests arriving by the wall clock (the engine's own step loop plays the clients):

    python bench/scheduling.py [--quick]

1. Priorities: a flood of priority-10 requests, topped up to several times the engine's seats,
   with priority-0 requests arriving through it. Their time to first token (TTFT) beside the
   same requests on the idle engine (target: p99 under the flood <= 2x idle + one step), under
   the priority policy and under fcfs. Every admission is checked against the aging rule: no
   request goes ahead of one it should not (a later arrival, unless more urgent by more levels
   than its lateness in AGING_STEPS steps).
2. Fair shares: two users, one sending 10x the other's requests, both backlogged; the lighter
   user's share of output tokens while both have work waiting (until the lighter's last request
   starts; target >= 45%), under fair and fcfs; once the lighter is done, the heavier's share
   (target 100%) and the throughput beside fcfs's (work conserving).
3. The host KV tier: 16 conversations of 4 turns (histories past 1,500 tokens) with a device KV
   cache that holds a quarter of them; returning turns' TTFT with and without --swap-space
   (target: >= 3x lower with it), their greedy outputs compared with a device cache that holds
   every history (the KV a returning turn should find). Then a burst of 16 requests
   whose outputs outgrow the device's cache (preemption forced): preemptions, and the tokens
   recomputed after them (target: at most one partial block per preemption with the tier)."""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from serving import pct

from argosy import LLM, SamplingParams
from argosy.server.scheduling.policy import AGING_STEPS

GIB = 1 << 30


@dataclass
class Sent:
    """One request as the loop saw it: when it arrived and got its tokens, in seconds and steps."""

    prompt: list[int]
    priority: int = 0
    user: str | None = None
    arrival: float = 0.0
    arrival_step: int = 0
    first_token: float | None = None
    first_step: int | None = None
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finished: float | None = None

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival


class Loop:
    """Runs an engine's steps, adding the requests `feed` hands over before each one."""

    def __init__(self, llm: LLM, params: SamplingParams):
        self.engine, self.params = llm.engine, params
        self.sent: dict[str, Sent] = {}
        self.step_seconds: list[float] = []

    @property
    def steps(self) -> int:
        return self.engine.core.scheduler.steps

    def send(self, request_id: str, request: Sent, params: SamplingParams | None = None) -> None:
        request.arrival, request.arrival_step = time.perf_counter(), self.steps
        self.sent[request_id] = request
        self.engine.add_request(
            request_id, request.prompt, params or self.params, priority=request.priority, user=request.user
        )

    def run(self, feed: Callable[[Loop], bool]) -> None:
        """`feed(loop)` sends what has arrived; it returns False once nothing more will come."""
        more = True
        while True:
            more = more and feed(self)
            if not self.engine.has_unfinished_requests():
                if not more:
                    return
                time.sleep(0.001)
                continue
            start = time.perf_counter()
            outputs = self.engine.step()
            now = time.perf_counter()
            self.step_seconds.append(now - start)
            for out in outputs:
                request = self.sent[out.request_id]
                new = out.outputs[0].token_ids[len(request.token_ids) :]
                if new and request.first_token is None:
                    request.first_token, request.first_step = now, self.steps
                request.token_ids += new
                request.token_times += [now] * len(new)
                if out.finished:
                    request.finished = now


def random_prompt(rng: random.Random, vocab: int, length: int) -> list[int]:
    return [rng.randrange(1000, vocab) for _ in range(length)]


# 1. Priorities


def aging_violations(sent: dict[str, Sent]) -> int:
    """Pairs where a request ran first that the aging rule puts behind: one that arrived
    later by at least (its priority - the other's) x AGING_STEPS steps."""
    started = [r for r in sent.values() if r.first_step is not None]
    violations = 0
    for a in started:
        for b in started:
            late = b.arrival_step - a.arrival_step
            if b.first_step < a.first_step and late > 0 and late >= (a.priority - b.priority) * AGING_STEPS:
                violations += 1
    return violations


def priority_flood(policy: str, args, vocab: int) -> dict:
    seats = args.seats
    llm = LLM(max_num_seqs=seats, scheduling_policy=policy, dtype=args.dtype)
    rng = random.Random(1)
    urgent_params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    loop = Loop(llm, SamplingParams(temperature=0.0, max_tokens=args.flood_tokens, ignore_eos=True))
    flood_priority = 10 if policy == "priority" else 0  # fcfs serves priority 0 only

    # The idle engine: urgent requests one at a time.
    idle = []
    for i in range(5):
        request = Sent(random_prompt(rng, vocab, args.prompt_tokens))
        loop.send(f"idle-{i}", request, urgent_params)
        loop.run(lambda _: False)
        idle.append(request.ttft)
    loop.sent.clear()
    loop.step_seconds.clear()

    count = {"flood": 0, "urgent": 0}
    start = time.perf_counter()

    def feed(loop: Loop) -> bool:
        now = time.perf_counter() - start
        waiting = loop.engine.core.num_requests()[0]
        while now < args.flood_seconds and waiting < args.flood_depth * seats:
            loop.send(f"flood-{count['flood']}", Sent(random_prompt(rng, vocab, args.prompt_tokens), flood_priority))
            count["flood"] += 1
            waiting += 1
        if count["urgent"] < args.urgent and now >= 1.0 + count["urgent"] * args.urgent_every:
            request = Sent(random_prompt(rng, vocab, args.prompt_tokens))
            loop.send(f"urgent-{count['urgent']}", request, urgent_params)
            count["urgent"] += 1
        return now < args.flood_seconds or count["urgent"] < args.urgent

    loop.run(feed)
    urgent = [r.ttft for name, r in loop.sent.items() if name.startswith("urgent")]
    urgent_steps = [r.first_step - r.arrival_step for name, r in loop.sent.items() if name.startswith("urgent")]
    flood = [r for name, r in loop.sent.items() if name.startswith("flood")]
    stats = llm.stats()
    return {
        "idle": statistics.median(idle),
        "step": statistics.median(loop.step_seconds),
        "urgent_p50": pct(urgent, 50),
        "urgent_p99": pct(urgent, 99),
        "urgent_steps": max(urgent_steps),
        "step_p99": pct(loop.step_seconds, 99),
        "flood_requests": len(flood),
        "flood_longest_wait_steps": max(r.first_step - r.arrival_step for r in flood),
        "flood_longest_wait_s": max(r.ttft for r in flood),
        "violations": aging_violations(loop.sent),
        "preemptions": stats.preemptions.get("priority", 0),
    }


# 2. Fair shares


def two_tenants(policy: str, args, vocab: int) -> dict:
    llm = LLM(max_num_seqs=args.seats, scheduling_policy=policy, dtype=args.dtype)
    rng = random.Random(2)
    loop = Loop(llm, SamplingParams(temperature=0.0, max_tokens=args.fair_tokens, ignore_eos=True))
    sent = [False]

    def feed(loop: Loop) -> bool:
        if not sent[0]:  # both backlogged from the start, in arrival order 10 heavy : 1 light
            for i in range(args.light_requests):
                for j in range(10):
                    loop.send(f"heavy-{i}-{j}", Sent(random_prompt(rng, vocab, args.prompt_tokens), user="heavy"))
                loop.send(f"light-{i}", Sent(random_prompt(rng, vocab, args.prompt_tokens), user="light"))
            sent[0] = True
        return False

    start = time.perf_counter()
    loop.run(feed)
    seconds = time.perf_counter() - start
    # Both have work while the light user has requests waiting: until its last one starts.
    light_done = max(r.first_token for r in loop.sent.values() if r.user == "light")

    def tokens(user: str, until: float | None = None, after: float | None = None) -> int:
        return sum(
            1
            for r in loop.sent.values()
            if r.user == user
            for t in r.token_times
            if (until is None or t <= until) and (after is None or t > after)
        )

    light, heavy = tokens("light", light_done), tokens("heavy", light_done)
    light_gone = max(r.finished for r in loop.sent.values() if r.user == "light")  # heavy alone from here
    heavy_after, light_after = tokens("heavy", after=light_gone), tokens("light", after=light_gone)
    total = sum(len(r.token_ids) for r in loop.sent.values())
    return {
        "light_share": light / (light + heavy),
        "alone_share": heavy_after / (heavy_after + light_after) if heavy_after else float("nan"),
        "tokens_per_s": total / seconds,
    }


# 3. The host KV tier


def conversations(args, vocab: int) -> list[list[int]]:
    rng = random.Random(3)
    return [random_prompt(rng, vocab, args.history_tokens) for _ in range(args.conversations)]


def block_bytes(llm: LLM) -> int:
    """Of the engine's KV blocks of 16 tokens, in its dtype."""
    cfg = llm.engine.core.model_config
    itemsize = llm.engine.core.executor.worker.runner.dtype.itemsize
    return 2 * cfg.num_layers * 16 * cfg.num_kv_heads * cfg.head_dim * itemsize


def tier_engine(args, device_blocks: int, swap_space: float) -> LLM:
    return LLM(
        kv_cache_memory=device_blocks * args.block_bytes,
        max_num_seqs=args.conversations,
        max_model_len=4096,
        swap_space=swap_space,
        dtype=args.dtype,
    )


def multi_turn(llm: LLM, args, vocab: int) -> dict:
    """The conversations' turns, `args.concurrency` conversations in flight, in rounds."""
    rng = random.Random(4)
    histories = conversations(args, vocab)
    loop = Loop(llm, SamplingParams(temperature=0.0, max_tokens=args.turn_tokens, ignore_eos=True))
    order = [(c, t) for t in range(args.turns) for c in range(args.conversations)]
    in_flight: dict[int, str] = {}

    def feed(loop: Loop) -> bool:
        for c, name in list(in_flight.items()):  # a finished turn's answer joins its history
            if loop.sent[name].finished is not None:
                histories[c] += loop.sent[name].token_ids + random_prompt(rng, vocab, args.user_tokens)
                del in_flight[c]
        while order and len(in_flight) < args.concurrency and order[0][0] not in in_flight:
            c, t = order.pop(0)
            in_flight[c] = f"c{c}-t{t}"
            loop.send(in_flight[c], Sent(list(histories[c])))
        return bool(order or in_flight)

    loop.run(feed)
    returning = [r.ttft for name, r in loop.sent.items() if not name.endswith("-t0")]
    return {
        "returning_p50": pct(returning, 50),
        "returning_mean": statistics.mean(returning),
        "outputs": {name: r.token_ids for name, r in loop.sent.items()},
        "history": max(map(len, histories)),
    }


def burst(llm: LLM, args, vocab: int) -> dict:
    """Preemption forced: 16 requests at once whose outputs outgrow the device's cache, both
    tiers emptied first."""
    llm.reset_prefix_cache()
    before = llm.stats()
    loop = Loop(llm, SamplingParams(temperature=0.0, max_tokens=args.burst_tokens, ignore_eos=True))
    queued = [False]

    def feed(loop: Loop) -> bool:
        if not queued[0]:
            for c, prompt in enumerate(conversations(args, vocab)):
                loop.send(f"burst-{c}", Sent(prompt[: args.burst_prompt]))
            queued[0] = True
        return False

    start = time.perf_counter()
    loop.run(feed)
    stats = llm.stats()
    return {
        "preemptions": stats.num_preemptions - before.num_preemptions,
        "recomputed": stats.recomputed_tokens - before.recomputed_tokens,
        "burst_seconds": time.perf_counter() - start,
        "host": stats.kv_host,
    }


def priorities(args, vocab: int) -> None:
    print(f"\n1. Priorities: {args.seats} seats, a flood of priority-10 requests kept at {args.flood_depth}x the seats "
          f"waiting for {args.flood_seconds:.0f} s, {args.urgent} priority-0 requests through it; "
          f"{args.prompt_tokens}-token prompts")  # fmt: skip
    print(
        "| policy | idle TTFT ms | step p50 / p99 ms | urgent TTFT p50 ms | p99 ms | target: p99 <= 2 x idle + step "
        "p50 | urgent's most steps to first token | flood requests | longest flood wait (steps / s) | "
        "aging violations | preemptions (priority) |"
    )
    print("|---|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|")
    for policy in ("priority", "fcfs"):
        r = priority_flood(policy, args, vocab)
        bound = 2 * r["idle"] + r["step"]
        met = "met" if r["urgent_p99"] <= bound else "missed"
        print(
            f"| {policy} | {r['idle'] * 1e3:.0f} | {r['step'] * 1e3:.0f} / {r['step_p99'] * 1e3:.0f} | "
            f"{r['urgent_p50'] * 1e3:.0f} | {r['urgent_p99'] * 1e3:.0f} | {met} ({bound * 1e3:.0f} ms) | "
            f"{r['urgent_steps']} | {r['flood_requests']} | "
            f"{r['flood_longest_wait_steps']} / {r['flood_longest_wait_s']:.1f} | {r['violations']} | "
            f"{r['preemptions']} |"
        )


def fair_shares(args, vocab: int) -> None:
    print(f"\n2. Fair shares: {args.seats} seats, user 'heavy' sends {10 * args.light_requests} requests and 'light' "
          f"{args.light_requests}, all at once; {args.fair_tokens} output tokens each")  # fmt: skip
    print("| policy | light's share while both wait | target >= 45% | heavy's share once alone | output tok/s |")
    print("|---|--:|---|--:|--:|")
    for policy in ("fair", "fcfs"):
        r = two_tenants(policy, args, vocab)
        met = "met" if r["light_share"] >= 0.45 else "missed"
        alone = "-" if r["alone_share"] != r["alone_share"] else f"{r['alone_share']:.0%}"  # NaN: never alone
        print(f"| {policy} | {r['light_share']:.0%} | {met} | {alone} | {r['tokens_per_s']:.1f} |")


def host_tier(args, vocab: int) -> None:
    final = args.history_tokens + (args.turns - 1) * (args.turn_tokens + args.user_tokens) + args.turn_tokens
    every = args.conversations * -(-final // 16)  # blocks of every conversation's history
    device_blocks = max(-(-4096 // 16), every // 4)  # a quarter of them
    swap = 2 * every * args.block_bytes / GIB
    runs = {}
    for name, swap_space in (("off", 0), ("on", swap)):
        llm = tier_engine(args, device_blocks, swap_space)
        runs[name] = multi_turn(llm, args, vocab) | burst(llm, args, vocab)
        del llm
    # The same turns with a device cache that holds every history: the KV the others should keep.
    whole = multi_turn(tier_engine(args, every + 256, 0), args, vocab)["outputs"]
    print(f"\n3. Host KV tier: {args.conversations} conversations x {args.turns} turns (histories up to "
          f"{runs['on']['history']} tokens), {args.concurrency} in flight; device KV cache {device_blocks} blocks "
          f"(a quarter of them); --swap-space {swap:.2f} GiB")  # fmt: skip
    print("| --swap-space | returning TTFT p50 ms | mean ms | greedy outputs as with a device cache holding all, by "
          "turn | burst: preemptions | recomputed tokens | bound (a block each) | burst s | tier blocks stored / "
          "loaded |")  # fmt: skip
    print("|---|--:|--:|---|--:|--:|--:|--:|--:|")
    for name, r in runs.items():
        host = r["host"]
        tier = f"{host.blocks_stored} / {host.blocks_loaded}" if host is not None else "-"
        same = [sum(r["outputs"][k] == v for k, v in whole.items() if k.endswith(f"-t{t}")) for t in range(args.turns)]
        print(
            f"| {name} | {r['returning_p50'] * 1e3:.0f} | {r['returning_mean'] * 1e3:.0f} | "
            f"{' '.join(f'{n}/{args.conversations}' for n in same)} | {r['preemptions']} | {r['recomputed']} | "
            f"{r['preemptions'] * 16} | {r['burst_seconds']:.1f} | {tier} |"
        )
    ratio = runs["off"]["returning_p50"] / runs["on"]["returning_p50"]
    print(f"\nreturning TTFT p50, off / on: {ratio:.1f}x (target >= 3x: {'met' if ratio >= 3 else 'missed'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller runs, to check the script")
    parser.add_argument("--seats", type=int, default=16, help="max_num_seqs of the priority and fair runs")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--flood-tokens", type=int, default=64, help="output tokens of a flood request")
    parser.add_argument("--flood-depth", type=int, default=3, help="flood requests kept waiting, per seat")
    parser.add_argument("--flood-seconds", type=float, default=30.0)
    parser.add_argument("--urgent", type=int, default=40, help="priority-0 requests through the flood")
    parser.add_argument("--urgent-every", type=float, default=0.7, help="seconds between them")
    parser.add_argument("--fair-tokens", type=int, default=32)
    parser.add_argument("--light-requests", type=int, default=12, help="the heavy user sends 10x as many")
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--history-tokens", type=int, default=1500, help="first turn's prompt")
    parser.add_argument("--user-tokens", type=int, default=48, help="each later turn's new message")
    parser.add_argument("--turn-tokens", type=int, default=32, help="output tokens per turn")
    parser.add_argument("--concurrency", type=int, default=4, help="conversations in flight at once")
    parser.add_argument("--burst-tokens", type=int, default=300, help="output tokens of each request of the burst")
    parser.add_argument("--burst-prompt", type=int, default=400, help="prompt tokens of each request of the burst")
    parser.add_argument("--only", type=int, nargs="+", default=[1, 2, 3], help="which of the three to run")
    parser.add_argument("--dtype", default="auto", help="the engines' dtype (float32: bit-exact prefix hits)")
    args = parser.parse_args()
    if args.quick:
        args.flood_seconds, args.urgent, args.light_requests, args.conversations = 4.0, 4, 6, 8
        args.history_tokens, args.turns, args.seats = 300, 2, 8
    probe = LLM(dtype=args.dtype)
    vocab = probe.engine.core.model_config.vocab_size
    args.block_bytes = block_bytes(probe)
    del probe

    if 1 in args.only:
        priorities(args, vocab)
    if 2 in args.only:
        fair_shares(args, vocab)
    if 3 in args.only:
        host_tier(args, vocab)


if __name__ == "__main__":
    main()
