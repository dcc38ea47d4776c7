"""KV-cache events from the engine, read by a subscriber written from vLLM's format: a prompt's full
blocks are announced as they fill, with the hashes a consumer computes from the documented
settings; the device's evictions go to the host tier (removed on GPU, stored on CPU with their
tokens) and out of it; a LoRA request's blocks carry its adapter; a reset clears all; replay."""

from __future__ import annotations

import pytest

from argosy import LoRARequest, SamplingParams
from tests.adapters import make_adapter
from tests.checkpoints import tiny_llm
from tests.polling import wait_until
from tests.server.kv_events.vllm_subscriber import Subscriber, chain, replay
from tests.server.kv_tier.test_host_tier_engine import BLOCK_BYTES, GIB

GREEDY = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
PROMPT = [(7 * i) % 290 + 3 for i in range(40)]


def events_llm(path, **kwargs):
    config = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*"}
    return tiny_llm(path, kv_events_config=config, **kwargs)


@pytest.fixture
def subscribed(llama_checkpoint):
    def start(**kwargs):
        llm = events_llm(llama_checkpoint, **kwargs)
        sub = Subscriber(llm.engine.core.kv_events.bound_endpoints[0])
        warm = SamplingParams(temperature=0.0, max_tokens=1)
        sub.wait_connected(lambda: (llm.generate({"prompt_token_ids": [5] * 16 + [6]}, warm), llm.reset_prefix_cache()))
        sub.messages.clear()
        opened.append(sub)
        return llm, sub

    opened: list[Subscriber] = []
    yield start
    for sub in opened:
        sub.close()


def test_a_prompts_blocks_are_announced_with_the_hashes_a_consumer_computes(subscribed):
    llm, sub = subscribed()
    out = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)[0]
    sub.drain(llm.engine.core.kv_events)
    stored = [e for e in sub.events() if e["type"] == "BlockStored"]
    tokens = PROMPT + out.outputs[0].token_ids  # 49 tokens: three full blocks (the last by a generated token)
    expected = chain(tokens, 16)
    assert [h for e in stored for h in e["block_hashes"]] == expected
    first = stored[0]
    assert first["parent_block_hash"] is None and first["token_ids"] == PROMPT[:32]  # the prompt's two, in one run
    assert stored[-1]["parent_block_hash"] == expected[1] and stored[-1]["token_ids"] == tokens[32:48]
    assert {(e["block_size"], e["medium"], e["lora_id"], e["lora_name"]) for e in stored} == {(16, "GPU", None, None)}
    numbers = [seq for _, seq, _ in sub.messages]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) and {t for t, _, _ in sub.messages} == {b""}
    again = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)[0]  # all cached: nothing new to announce
    assert again.num_cached_tokens == 32
    sub.drain(llm.engine.core.kv_events)
    assert not [e for e in sub.events(sub.messages[len(numbers) :]) if e["type"] == "BlockStored"]


def test_eviction_moves_blocks_to_the_host_tier_and_out_of_it(subscribed):
    llm, sub = subscribed(kv_cache_memory=12 * BLOCK_BYTES, swap_space=4 * BLOCK_BYTES / GIB, max_model_len=128)
    prompts = [[(13 * i + j) % 290 + 3 for j in range(33)] for i in range(6)]  # two full blocks each
    for prompt in prompts:
        llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=1))
    sub.drain(llm.engine.core.kv_events)
    events = sub.events()
    hashes = {h: i for i, p in enumerate(prompts) for h in chain(p, 16)}
    gpu_removed = [h for e in events if e["type"] == "BlockRemoved" and e["medium"] == "GPU" for h in e["block_hashes"]]
    cpu_stored = [e for e in events if e["type"] == "BlockStored" and e["medium"] == "CPU"]
    cpu_removed = [h for e in events if e["type"] == "BlockRemoved" and e["medium"] == "CPU" for h in e["block_hashes"]]
    assert gpu_removed and set(gpu_removed) <= set(hashes)
    # Each block the device let go went to the tier, announced with its own tokens and parent.
    assert [e["block_hashes"][0] for e in cpu_stored] == gpu_removed
    for event in cpu_stored:
        prompt = prompts[hashes[event["block_hashes"][0]]]
        index = chain(prompt, 16).index(event["block_hashes"][0])
        assert event["token_ids"] == prompt[16 * index : 16 * index + 16]
        assert event["parent_block_hash"] == (chain(prompt, 16)[0] if index else None)
    # The tier holds 4 blocks: the oldest went out of it, in the order they came in.
    assert cpu_removed == gpu_removed[: len(cpu_removed)] and len(gpu_removed) - len(cpu_removed) == 4
    # A prompt loaded back from the tier is on the device again.
    back = prompts[len(cpu_removed) // 2 + 1]
    sub.messages.clear()
    assert llm.generate({"prompt_token_ids": back}, SamplingParams(temperature=0.0, max_tokens=1))[0].num_cached_tokens
    sub.drain(llm.engine.core.kv_events)
    events = sub.events()
    gpu_stored = [h for e in events if e["type"] == "BlockStored" and e["medium"] == "GPU" for h in e["block_hashes"]]
    assert set(chain(back, 16)) <= set(gpu_stored)


def test_a_reset_clears_every_block(subscribed):
    llm, sub = subscribed()
    llm.generate({"prompt_token_ids": PROMPT}, GREEDY)
    assert llm.reset_prefix_cache()
    sub.drain(llm.engine.core.kv_events)
    assert sub.events()[-1] == {"type": "AllBlocksCleared"}


def test_replay_sends_the_buffered_batches_from_a_number_on(llama_checkpoint):
    config = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*",
              "buffer_steps": 3}  # fmt: skip
    llm = tiny_llm(llama_checkpoint, kv_events_config=config)
    for i in range(5):  # five batches: a reset each
        llm.generate({"prompt_token_ids": [i + 3] * 17}, SamplingParams(temperature=0.0, max_tokens=1))
        llm.reset_prefix_cache()
    publisher = llm.engine.core.kv_events
    _, endpoint = publisher.bound_endpoints
    wait_until(lambda: publisher.pending == 0, 10, "the queued batches to be sent")  # none arrives meanwhile
    numbers = [seq for seq, _ in replay(endpoint, 0)]  # asked from 0: what is left, the last three
    assert numbers == [publisher.published - 3, publisher.published - 2, publisher.published - 1]
    tail = replay(endpoint, publisher.published - 1)
    assert [seq for seq, _ in tail] == [publisher.published - 1] and tail[0][1][1] == [{"type": "AllBlocksCleared"}]
    assert replay(endpoint, publisher.published + 5) == []


def test_a_lora_requests_blocks_carry_its_adapter(subscribed, llama_checkpoint, tmp_path):
    llm, sub = subscribed(enable_lora=True, max_lora_rank=8)
    lora = LoRARequest("tuned", 1, str(make_adapter(llama_checkpoint, tmp_path / "tuned", rank=4)))
    llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0.0, max_tokens=1), lora_request=lora)
    sub.drain(llm.engine.core.kv_events)
    (stored,) = [e for e in sub.events() if e["type"] == "BlockStored"]
    digest = llm.engine.adapters.get("tuned").digest
    assert stored["lora_name"] == "tuned" and stored["lora_id"] == int(digest[:8], 16)
    # Its chain starts from the adapter's weights: never equal to the base model's for the same tokens.
    assert stored["block_hashes"] == chain(PROMPT, 16, seed=bytes.fromhex(digest)) != chain(PROMPT, 16)
