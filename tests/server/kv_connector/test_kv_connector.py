"""The KV connector: the host tier named by --kv-transfer-config is --swap-space's; a connector
plugged in by module path whose loads take several steps holds back only its own sequence (the
others decode meanwhile) and gives the same tokens; one whose loads fail falls back to computing
the blocks again (tokens unchanged, though the failed blocks hold noise, and none of them enters
the prefix cache); a bad configuration is refused naming its field; a plan's transfers and a
result's report cross the wire codec."""

from __future__ import annotations

import msgspec
import pytest

from argosy import SamplingParams
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import InvalidRequestError
from argosy.server.executor.plan import StepPlan, StepResult
from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.kv_tier.tier_scheduler import HostTierMeta
from tests.checkpoints import tiny_llm
from tests.server.kv_tier.test_host_tier_engine import BLOCK_BYTES, CONVERSATION, GIB, evict_with_other_prompts

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
HOST = {"kv_connector": "HostTierConnector"}


def tier_llm(path, connector: str = "HostTierConnector", module: str | None = None, **extra):
    config = {
        "kv_connector": connector,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"swap_space": 64 * BLOCK_BYTES / GIB, **extra},
    }
    if module is not None:
        config["kv_connector_module_path"] = module
    return tiny_llm(path, kv_cache_memory=30 * BLOCK_BYTES, max_model_len=384, kv_transfer_config=config)


def returning(llm) -> tuple[list[int], list[int], int]:
    """The conversation's tokens, then again after its blocks were pushed to the tier; and the
    tokens found cached the second time."""
    first = llm.generate({"prompt_token_ids": CONVERSATION}, PARAMS)[0]
    evict_with_other_prompts(llm)
    again = llm.generate({"prompt_token_ids": CONVERSATION}, PARAMS)[0]
    return first.outputs[0].token_ids, again.outputs[0].token_ids, again.num_cached_tokens


def test_the_host_tier_named_as_a_connector_is_the_swap_space_one(llama_checkpoint):
    named = tier_llm(llama_checkpoint)
    swap = tiny_llm(llama_checkpoint, kv_cache_memory=30 * BLOCK_BYTES, max_model_len=384,
                    swap_space=64 * BLOCK_BYTES / GIB)  # fmt: skip
    assert returning(named) == returning(swap)
    assert named.stats().kv_host == swap.stats().kv_host and named.stats().kv_host.blocks_loaded == 6


def test_loads_over_several_steps_hold_back_their_sequence_alone(llama_checkpoint):
    llm = tier_llm(llama_checkpoint, "SlowHostTier", "tests.server.kv_connector.slow_tier", delay_steps=4)
    first = llm.generate({"prompt_token_ids": CONVERSATION}, PARAMS)[0]
    evict_with_other_prompts(llm)
    engine = llm.engine
    engine.add_request("other", list(range(40, 60)), SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    engine.step()
    engine.add_request("loading", CONVERSATION, PARAMS)
    waited, tokens = 0, []
    while engine.has_unfinished_requests():
        ran = {out.request_id: out for out in engine.step()}
        if "loading" in ran:
            tokens = ran["loading"].outputs[0].token_ids
        elif not tokens and "other" in ran:
            waited += 1  # the other request decoded while these blocks loaded
    assert waited >= 3 and tokens == first.outputs[0].token_ids
    assert llm.stats().kv_host.blocks_loaded == 6


def test_failed_loads_are_computed_again_and_never_cached(llama_checkpoint):
    llm = tier_llm(llama_checkpoint, "SlowHostTier", "tests.server.kv_connector.slow_tier", delay_steps=1, fail=True)
    first, again, cached = returning(llm)
    assert again == first  # the failed blocks hold noise: read, they would change the tokens
    assert cached == 0  # all six of its blocks were in the tier; their loads failed, so all were computed again
    third = llm.generate({"prompt_token_ids": CONVERSATION}, PARAMS)[0]
    assert third.outputs[0].token_ids == first and third.num_cached_tokens == 96  # computed, then cached
    liar = tier_llm(llama_checkpoint, "SlowHostTier", "tests.server.kv_connector.slow_tier", delay_steps=1, lie=1)
    first, again, _ = returning(liar)
    assert again != first  # the same noise, read as loaded: the tokens tell


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ("{not json", "kv_transfer_config"),
        ({"kv_connector": "Nowhere"}, "kv_transfer_config.kv_connector"),
        ({"kv_connector": "HostTierConnector", "kv_role": "kv_sender"}, "kv_transfer_config.kv_role"),
        ({"kv_connector": "HostTierConnector", "kv_connector_extra_config": {"swap_space": 0}},
         "kv_transfer_config.kv_connector_extra_config.swap_space"),
        ({**HOST, "kv_role": "kv_producer", "kv_connector_extra_config": {"swap_space": 1}},
         "kv_transfer_config.kv_role"),
        ({"kv_connector": "HostTierConnector", "typo": 1}, "kv_transfer_config.typo"),
        ({"kv_connector": "Missing", "kv_connector_module_path": "tests.server.kv_connector.slow_tier"},
         "kv_transfer_config.kv_connector"),
    ],
)  # fmt: skip
def test_a_bad_configuration_is_refused_naming_its_field(config, field):
    with pytest.raises(InvalidRequestError) as caught:
        EngineConfig(kv_transfer_config=config)
    assert caught.value.param == field


def test_a_plans_transfers_and_a_results_report_cross_the_wire():
    plan = StepPlan([], [], [], [], [], kv_connector=HostTierMeta([(3, 0)], [(1, 7), (2, 8)], [5]))
    result = StepResult([], [], [], kv_connector=KVConnectorOutput([5], [8]))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(plan), type=StepPlan) == plan
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(result), type=StepResult) == result
