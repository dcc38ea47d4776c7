"""The P/D connectors' configuration: each bad setting refused at start naming its field, tensor
parallelism refused, a side-channel port in use a clear error, not a hang."""

from __future__ import annotations

import socket

import pytest
import torch

from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import EndpointInUseError, InvalidRequestError
from argosy.server.kv_transfer.pull import layout_of
from argosy.server.kv_transfer.side_channel import SideChannel

EXTRA = "kv_transfer_config.kv_connector_extra_config"


def with_extra(**extra) -> dict:
    return {"kv_role": "kv_both", "kv_connector_extra_config": extra}


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (
            {"kv_role": "kv_both", "kv_connector_extra_config": {"side_channel_port": 70000}},
            f"{EXTRA}.side_channel_port",
        ),
        ({"kv_role": "kv_both", "kv_connector_extra_config": {"side_channel_host": ""}}, f"{EXTRA}.side_channel_host"),
        ({"kv_role": "kv_both", "kv_connector_extra_config": {"hold_timeout": 0}}, f"{EXTRA}.hold_timeout"),
        ({"kv_role": "kv_both", "kv_connector_extra_config": {"pull_timeout": True}}, f"{EXTRA}.pull_timeout"),
        ({"kv_connector": "NixlConnector", "kv_connector_extra_config": {"typo": 1}}, f"{EXTRA}.typo"),
        ({"kv_role": "kv_sender"}, "kv_transfer_config.kv_role"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(config, field):
    with pytest.raises(InvalidRequestError) as caught:
        EngineConfig(kv_transfer_config=config)
    assert caught.value.param == field


def test_tensor_parallelism_is_refused():
    with pytest.raises(InvalidRequestError, match="tensor_parallel_size must be 1") as caught:
        EngineConfig(kv_transfer_config={"kv_role": "kv_both"}, tensor_parallel_size=2)
    assert caught.value.param == "kv_transfer_config"


def test_a_role_alone_picks_the_zmq_connector():
    assert EngineConfig(kv_transfer_config={"kv_role": "kv_both"}).kv_transfer.kv_connector == "ZmqConnector"


def test_a_side_channel_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EndpointInUseError, match=f"side channel tcp://127.0.0.1:{port} cannot be bound"):
            SideChannel("e", layout_of((2, 2, 16, 1, 8), torch.float32), "127.0.0.1", port)
