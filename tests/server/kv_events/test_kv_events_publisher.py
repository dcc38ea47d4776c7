"""The publisher and its settings: a malformed --kv-events-config is refused naming its field; an
endpoint already bound is a clear error at once; a subscriber that never reads stalls nothing
(every publish returns, the batches are sent or counted as dropped); the wire encoding is
vLLM's, read by the msgpack package."""

from __future__ import annotations

import re
import time

import msgpack
import msgspec
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from argosy.server.api.metrics import ServerMetrics
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import EndpointInUseError, InvalidRequestError
from argosy.server.kv_events.config import KVEventsConfig
from argosy.server.kv_events.publisher import ZmqEventPublisher
from argosy.server.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from argosy.server.outputs import EngineStats

LOOPBACK = "tcp://127.0.0.1:*"


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("{", "kv_events_config"),
        ("[1]", "kv_events_config"),
        ({"enable_kv_cache_events": "yes"}, "kv_events_config.enable_kv_cache_events"),
        ({"enable_kv_cache_events": True, "publisher": "kafka"}, "kv_events_config.publisher"),
        ({"endpoint": "localhost:5557"}, "kv_events_config.endpoint"),
        ({"endpoint": "tcp://"}, "kv_events_config.endpoint"),
        ({"replay_endpoint": "tcp://*:5557"}, "kv_events_config.replay_endpoint"),
        ({"buffer_steps": 0}, "kv_events_config.buffer_steps"),
        ({"hwm": -1}, "kv_events_config.hwm"),
        ({"hwm": True}, "kv_events_config.hwm"),
        ({"max_queue_size": 1.5}, "kv_events_config.max_queue_size"),
        ({"topic": 3}, "kv_events_config.topic"),
        ({"enable_kv_cache_event": True}, "kv_events_config.enable_kv_cache_event"),
    ],
)
def test_a_malformed_config_is_refused_naming_its_field(value, field):
    with pytest.raises(InvalidRequestError) as caught:
        EngineConfig(kv_events_config=value)
    assert caught.value.param == field and field in str(caught.value)


def test_defaults_are_vllms():
    on = KVEventsConfig.parse('{"enable_kv_cache_events": true}')
    assert on.publishes and (on.publisher, on.endpoint, on.replay_endpoint) == ("zmq", "tcp://*:5557", None)
    assert on.topic == ""
    assert (on.buffer_steps, on.hwm, on.max_queue_size) == (10_000, 100_000, 100_000)
    assert not KVEventsConfig.parse("{}").publishes
    assert not KVEventsConfig.parse({"enable_kv_cache_events": True, "publisher": "null"}).publishes
    with pytest.raises(InvalidRequestError, match="prefix caching"):
        EngineConfig(kv_events_config={"enable_kv_cache_events": True}, enable_prefix_caching=False)


def test_an_endpoint_in_use_is_a_clear_error_at_once():
    first = ZmqEventPublisher(KVEventsConfig(True, "zmq", "tcp://*:*"))
    taken = "tcp://*:" + first.bound_endpoints[0].rpartition(":")[2]
    try:
        with pytest.raises(EndpointInUseError, match=re.escape(f"kv_events_config.endpoint {taken} cannot be bound")):
            ZmqEventPublisher(KVEventsConfig(True, "zmq", taken))
        with pytest.raises(EndpointInUseError, match=r"kv_events_config\.replay_endpoint"):
            ZmqEventPublisher(KVEventsConfig(True, "zmq", LOOPBACK, replay_endpoint=taken))
    finally:
        first.close()


def test_a_subscriber_that_never_reads_stalls_nothing():
    publisher = ZmqEventPublisher(KVEventsConfig(True, "zmq", LOOPBACK, hwm=10, max_queue_size=50))
    context = zmq.Context()
    stalled = context.socket(zmq.SUB)
    stalled.setsockopt(zmq.SUBSCRIBE, b"")
    stalled.set_hwm(10)
    stalled.connect(publisher.bound_endpoints[0])
    time.sleep(0.2)
    event = BlockStored(list(range(64)), None, list(range(1024)), 16, None, "GPU", None)
    for _ in range(5000):
        publisher.publish(EventBatch(time.time(), [event], 0))
    publisher.close()
    assert publisher.published + publisher.dropped == 5000 and publisher.published > 0
    received = 0
    while stalled.poll(100):
        stalled.recv_multipart()
        received += 1
    assert received < publisher.published  # the socket dropped for the slow subscriber rather than wait
    stalled.close(linger=0)
    context.term()


def test_the_encoding_is_vllms():
    batch = EventBatch(
        1.5,
        [
            BlockStored([1, 2], None, [7] * 32, 16, None, "GPU", None),
            BlockRemoved([2**64 - 1], "CPU"),
            AllBlocksCleared(),
        ],
        0,
    )
    assert msgpack.unpackb(msgspec.msgpack.encode(batch)) == [
        1.5,
        [
            {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [7] * 32,
             "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None},
            {"type": "BlockRemoved", "block_hashes": [2**64 - 1], "medium": "CPU"},
            {"type": "AllBlocksCleared"},
        ],
        0,
    ]  # fmt: skip


def test_without_a_wildcard_it_connects_to_a_subscriber_that_binds():
    """llm-d's Endpoint Picker binds and the replicas connect to it, as vLLM's publisher decides."""
    context = zmq.Context()
    collector = context.socket(zmq.SUB)
    collector.setsockopt(zmq.SUBSCRIBE, b"")
    port = collector.bind_to_random_port("tcp://127.0.0.1")
    publisher = ZmqEventPublisher(KVEventsConfig(True, "zmq", f"tcp://127.0.0.1:{port}", topic="kv@pod@m"))
    try:
        for _ in range(50):
            publisher.publish(EventBatch(time.time(), [AllBlocksCleared()], 0))
            if collector.poll(100):
                break
        topic, _, payload = collector.recv_multipart()
        assert topic == b"kv@pod@m" and msgpack.unpackb(payload)[1] == [{"type": "AllBlocksCleared"}]
    finally:
        publisher.close()
        collector.close(linger=0)
        context.term()


def test_dropped_batches_are_counted_in_prometheus():
    metrics = ServerMetrics("m")

    def dropped() -> float:
        families = text_string_to_metric_families(metrics.render().decode())
        return next(s.value for f in families for s in f.samples if s.name == "argosy_kv_events_dropped_total")

    for total in (0, 3, 3, 10):  # the engine's running total: the counter follows its increases
        metrics.sync_engine_counters(EngineStats(0, 0, 1, 0, 0, 0, 0, kv_events_dropped=total))
    assert dropped() == 10
