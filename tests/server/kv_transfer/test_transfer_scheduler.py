"""The P/D connector's engine half on its own: which blocks a finished prefill holds and for how long,
what its answer signs, which blocks a decode pulls (after its own hits, leaving a token to compute),
once even across a preemption, and what it lets go of when."""

from __future__ import annotations

import time

import pytest

from argosy import SamplingParams
from argosy.server.engine.request_options import RequestOptions
from argosy.server.engine.sequence import Request, Sequence
from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.kv_transfer.hold_token import verify
from argosy.server.kv_transfer.params import KVTransferParams
from argosy.server.kv_transfer.transfer_scheduler import SideChannelAddress, TransferScheduler

ADDRESS = SideChannelAddress("engine-a", "10.0.0.1", 5600, b"s" * 32)


def sequence(request_id: str, prompt_len: int, params: KVTransferParams | None, blocks: list[int]) -> Sequence:
    options = RequestOptions(kv_transfer=params)
    request = Request(request_id, list(range(prompt_len)), SamplingParams(max_tokens=4), options=options)
    seq = Sequence(int(request_id.removeprefix("r")), request, 0, list(request.prompt_token_ids))
    seq.block_table = list(blocks)
    return seq


def prefilled(scheduler: TransferScheduler, prompt_len: int, blocks: list[int], request_id: str = "r1"):
    seq = sequence(request_id, prompt_len, KVTransferParams(do_remote_decode=True), blocks)
    seq.finish_reason = "length"
    return seq, scheduler.request_finished(seq)


def test_a_finished_prefill_holds_its_full_prompt_blocks_and_signs_them():
    scheduler = TransferScheduler(ADDRESS, 16, hold_timeout=60)
    seq, held = prefilled(scheduler, 40, [7, 8, 9])  # 40 tokens: two full blocks, the third partial
    assert held == [7, 8] and scheduler.busy
    params = scheduler.transfer_params(seq)
    assert (params.remote_engine_id, params.remote_host, params.remote_port) == ("engine-a", "10.0.0.1", 5600)
    assert params.remote_block_ids == [7, 8] and params.remote_request_id == "r1"
    assert verify(ADDRESS.secret, "r1", [7, 8], params.hold_deadline, params.hold_token)
    assert not verify(ADDRESS.secret, "r1", [7, 8, 9], params.hold_deadline, params.hold_token)
    assert 59 < params.hold_deadline - time.monotonic() <= 60


@pytest.mark.parametrize("reason", [None, "abort"])
def test_a_prefill_that_did_not_finish_on_its_own_holds_nothing(reason):
    scheduler = TransferScheduler(ADDRESS, 16, hold_timeout=60)
    seq = sequence("r1", 40, KVTransferParams(do_remote_decode=True), [7, 8, 9])
    seq.finish_reason = reason  # preempted, or aborted
    assert scheduler.request_finished(seq) == [] and scheduler.transfer_params(seq) is None


def test_a_prompt_shorter_than_a_block_names_no_hold():
    scheduler = TransferScheduler(ADDRESS, 16, hold_timeout=60)
    seq, held = prefilled(scheduler, 12, [3])
    assert held == [] and scheduler.transfer_params(seq) is None and not scheduler.busy


def test_a_hold_goes_back_when_pulled_or_when_its_time_is_up():
    scheduler = TransferScheduler(ADDRESS, 16, hold_timeout=60)
    prefilled(scheduler, 40, [7, 8, 9], "r1")
    prefilled(scheduler, 40, [4, 5, 6], "r2")
    scheduler.update_connector_output(KVConnectorOutput(finished_sends=["r1"]))
    assert scheduler.take_released() == [7, 8] and scheduler.take_released() == []
    scheduler.hold_timeout = 0.0
    prefilled(scheduler, 40, [1, 2, 3], "r3")  # expires at once
    meta = scheduler.build_connector_meta()
    assert scheduler.take_released() == [1, 2] and scheduler.stats.holds_expired == 1
    assert [request_id for request_id, _ in meta.releases] == ["r1", "r3"]  # the worker revokes both
    assert scheduler.busy  # r2 is still held


def test_a_decode_pulls_the_blocks_after_its_own_hits_once_even_after_a_preemption():
    scheduler = TransferScheduler(ADDRESS, 16, hold_timeout=60)
    params = KVTransferParams(False, True, "engine-a", "10.0.0.1", 5600, [7, 8, 9, 10], "r1", 1, 1e9, "t")
    seq = sequence("r2", 64, params, [])  # 64 tokens: four full blocks, the last one's token computed here
    assert scheduler.get_num_new_matched_tokens(seq, 1) == 2 * 16  # its own first block, then 8 and 9
    seq.block_table = [40, 41, 42]
    scheduler.update_state_after_alloc(seq, [41, 42])
    (pull,) = scheduler.build_connector_meta().pulls
    assert pull.request.block_ids == [8, 9] and pull.local_block_ids == [41, 42] and pull.request.held == [7, 8, 9, 10]
    assert pull.address == "tcp://10.0.0.1:5600" and pull.request.token == "t"
    scheduler.update_connector_output(KVConnectorOutput(finished_loads=[seq.seq_id]))
    scheduler.request_finished(seq)  # preempted (no finish reason): it comes back and computes
    assert scheduler.get_num_new_matched_tokens(seq, 0) == 0 and scheduler.build_connector_meta() is None


def test_a_decode_holding_every_block_lets_the_hold_go_and_a_refused_pull_fails_its_request():
    scheduler = TransferScheduler(ADDRESS, 16, hold_timeout=60)
    params = KVTransferParams(False, True, "engine-a", "10.0.0.1", 5600, [7, 8], "r1", 1, 1e9, "t")
    cached = sequence("r2", 40, params, [])
    assert scheduler.get_num_new_matched_tokens(cached, 2) == 0
    (release,) = scheduler.build_connector_meta().pulls
    assert release.seq_id == -1 and release.request.block_ids == [] and release.local_block_ids == []
    pulling = sequence("r3", 40, params, [50, 51])
    scheduler.update_state_after_alloc(pulling, [50, 51])
    scheduler.update_connector_output(KVConnectorOutput(refused=[(pulling.seq_id, "no")]))
    assert scheduler.take_refused() == [("r3", "no")] and scheduler.stats.pulls_refused == 1
    left = sequence("r4", 40, params, [60, 61])  # leaves while its pull is in flight
    scheduler.update_state_after_alloc(left, [60, 61])
    left.finish_reason = "abort"
    assert scheduler.request_finished(left) == [60, 61]  # kept: a NIXL write may still land in them
    assert scheduler.build_connector_meta().cancels == [left.seq_id] and scheduler.busy
    scheduler.update_connector_output(KVConnectorOutput(cancels_done=[left.seq_id]))
    assert scheduler.take_released() == [60, 61] and not scheduler.busy
