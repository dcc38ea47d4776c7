"""`argosy kv-events ENDPOINT`: prints a replica's KV-cache events as they arrive, and the batches
it missed (a gap in the sequence numbers). ENDPOINT is a ZMQ endpoint, or a server's URL, whose
/kv_event_sources names it. With `--check URL --prompt TEXT` it sends the prompt to that server
(one token out), tokenizes it as the server does, computes the hashes of its full blocks from the
settings the server states (/server_info), and says whether blocks with those hashes arrived:
the tool for a fleet whose prefix-cache hit rate is zero."""

from __future__ import annotations

import argparse
import sys
import time

import httpx
import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from argosy.server.engine.block_hash import BlockHasher
from argosy.server.kv_events.wire import BlockStored, EventBatch, external_hash

DECODER = msgspec.msgpack.Decoder(EventBatch)


def add_kv_events_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("endpoint", help="tcp://HOST:PORT, or a server's http(s) URL (its /kv_event_sources)")
    parser.add_argument("--topic", default="", help="the topic subscribed to (default: every topic)")
    parser.add_argument("--check", metavar="URL", help="the server to send --prompt to and check the events of")
    parser.add_argument("--prompt", help="the prompt --check sends")
    parser.add_argument("--model", help="the model --check asks for (default: the server's first)")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (default: run until ^C)")


def run(args: argparse.Namespace) -> int:
    if (args.check is None) != (args.prompt is None):
        print("argosy kv-events: --check and --prompt go together", file=sys.stderr)
        return 2
    endpoint = resolve_endpoint(args.endpoint)
    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt_string(zmq.SUBSCRIBE, args.topic)
    # Watched from before the connection: a PUB socket drops what it sends before the subscription arrives.
    monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    socket.connect(endpoint)
    try:
        subscribed(socket, monitor)
        print(f"# subscribed to {endpoint}", flush=True)
        if args.check is not None:
            return check(socket, args.check, args.prompt, args.model, args.seconds or 10.0)
        watch(socket, args.seconds)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        socket.close(linger=0)
        context.term()


def resolve_endpoint(endpoint: str) -> str:
    if not endpoint.startswith(("http://", "https://")):
        return endpoint
    sources = httpx.get(f"{endpoint.rstrip('/')}/kv_event_sources", timeout=10).json()
    if not sources:
        raise SystemExit(f"argosy kv-events: {endpoint} publishes no KV events (start it with --kv-events-config)")
    published = sources["0"]["endpoint"]
    if "*" in published:  # a wildcard host is the server's own
        published = published.replace("*", httpx.URL(endpoint).host)
    return published


def subscribed(socket: zmq.Socket, monitor: zmq.Socket, seconds: float = 30.0) -> None:
    """Waits until the connection to the publisher is up (its handshake done, after which the
    subscription goes out at once)."""
    try:
        if not monitor.poll(int(seconds * 1000)):
            raise SystemExit(f"argosy kv-events: no publisher answered within {seconds:.0f} s")
        recv_monitor_message(monitor)
    finally:
        socket.disable_monitor()
        monitor.close(linger=0)


def receive(socket: zmq.Socket, seconds: float) -> tuple[int, EventBatch] | None:
    if not socket.poll(int(seconds * 1000)):
        return None
    _, seq, payload = socket.recv_multipart()
    return int.from_bytes(seq, "big", signed=True), DECODER.decode(payload)


def watch(socket: zmq.Socket, seconds: float) -> None:
    deadline, last = (time.monotonic() + seconds) if seconds else None, None
    while deadline is None or time.monotonic() < deadline:
        got = receive(socket, 0.5)
        if got is None:
            continue
        seq, batch = got
        if last is not None and seq != last + 1:
            print(f"# missed batches {last + 1}..{seq - 1} (ask the replay endpoint for them)")
        last = seq
        for event in batch.events:
            print(f"{seq} {batch.ts:.3f} {describe(event)}", flush=True)


def describe(event) -> str:
    name = type(event).__name__
    if isinstance(event, BlockStored):
        lora = "" if event.lora_name is None else f" lora={event.lora_name}"
        parent = "-" if event.parent_block_hash is None else f"{event.parent_block_hash:016x}"
        hashes = " ".join(f"{h:016x}" for h in event.block_hashes)
        return f"{name} {event.medium} parent={parent} blocks=[{hashes}] tokens={len(event.token_ids)}{lora}"
    if hasattr(event, "block_hashes"):
        return f"{name} {event.medium} blocks=[{' '.join(f'{h:016x}' for h in event.block_hashes)}]"
    return name


def check(socket: zmq.Socket, url: str, prompt: str, model: str | None, seconds: float) -> int:
    """Sends the prompt and compares the blocks announced with those the server's settings give."""
    url = url.rstrip("/")
    info = httpx.get(f"{url}/server_info", timeout=10).json()
    cache = info["vllm_config"]["cache_config"]
    model = model or info["model"]
    algo, seed = cache.get("hash_function"), cache.get("hash_seed")
    if algo not in ("sha256", "sha256_cbor") or (algo == "sha256_cbor" and seed is None):
        print(f"the server hashes blocks with {algo!r} and seed {seed!r}: no consumer can compute its hashes")
        print("(with sha256_cbor, set PYTHONHASHSEED on every replica and in the consumer)")
        return 1
    tokens = httpx.post(f"{url}/tokenize", json={"model": model, "prompt": prompt}, timeout=60).json()["tokens"]
    expected = block_hashes(tokens, cache["block_size"], BlockHasher(algo, seed))
    print(f"prompt: {len(tokens)} tokens, {len(expected)} full blocks of {cache['block_size']}")
    if not expected:
        print("the prompt fills no block: nothing can be announced; give a longer one")
        return 1
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    httpx.post(f"{url}/v1/completions", json=body, timeout=120).raise_for_status()
    announced, same_tokens, deadline = set(), [], time.monotonic() + seconds
    while time.monotonic() < deadline and not set(expected) <= announced:
        got = receive(socket, max(0.0, deadline - time.monotonic()))
        if got is None:
            break
        for event in got[1].events:
            if isinstance(event, BlockStored):
                announced.update(event.block_hashes)
                if event.token_ids == tokens[: len(event.token_ids)] and not set(event.block_hashes) & set(expected):
                    same_tokens.append(event)
    return report(expected, announced, same_tokens)


def report(expected: list[int], announced: set[int], same_tokens: list[BlockStored]) -> int:
    found = sum(h in announced for h in expected)
    if found == len(expected):
        print(f"ok: all {found} blocks announced with the hashes the server's settings give")
        return 0
    if same_tokens:
        print("MISMATCH: blocks with this prompt's tokens arrived under other hashes: the server hashes differently")
        print(
            "from what it states (or a LoRA adapter's seed applies); a router hashing tokens itself misses every time"
        )
    elif found:
        print(f"partial: {found} of {len(expected)} blocks announced (the rest were cached before this run)")
        return 0
    else:
        print(
            "nothing announced for this prompt: wrong endpoint or topic, events off, or the prompt was cached already"
        )
    return 1


def block_hashes(tokens: list[int], block_size: int, hasher: BlockHasher) -> list[int]:
    """External hashes of the full blocks, computed from the stated settings (the engine's chain)."""
    hashes, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hasher(parent, tokens[start : start + block_size])
        hashes.append(external_hash(parent))
    return hashes
