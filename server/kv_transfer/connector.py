"""ZmqConnector: prefill/decode disaggregation's KV connector (`--kv-transfer-config
'{"kv_connector": "ZmqConnector", "kv_role": "kv_both"}'`, or `{"kv_role": "kv_both"}` alone),
blocks pulled over ZMQ (TCP); NixlConnector the same with the blocks written by NIXL (the side
channel still deciding what is sent: nixl_transport.py), as vLLM users name it. Their extra
config: `side_channel_host` (the address decode replicas reach this one at; 127.0.0.1 by default,
the pod's IP in a cluster), `side_channel_port` (5600; 0 picks a free one), `hold_timeout`
(seconds a prefill's blocks wait for their pull, 480 as vLLM's) and `pull_timeout` (seconds a
pull waits for its answer, 30). Any role does both halves of the hand-off, as vLLM's NIXL
connector with `kv_both`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from argosy.server.exceptions import InvalidRequestError
from argosy.server.kv_connector.config import KVTransferConfig
from argosy.server.kv_transfer.nixl_transport import nixl_api
from argosy.server.kv_transfer.transfer_scheduler import SideChannelAddress, TransferScheduler

if TYPE_CHECKING:
    import torch

    from argosy.server.kv_transfer.transfer_worker import TransferWorker

EXTRA = "kv_transfer_config.kv_connector_extra_config"
DEFAULTS: dict[str, Any] = {"side_channel_host": "127.0.0.1", "side_channel_port": 5600, "hold_timeout": 480.0,
                            "pull_timeout": 30.0}  # fmt: skip


def settings(config: KVTransferConfig) -> dict[str, Any]:
    return {**DEFAULTS, **config.kv_connector_extra_config}


class ZmqConnector:
    USES_NIXL = False
    SINGLE_RANK = True  # one side channel, one rank's blocks: refused with tensor parallelism

    @classmethod
    def check(cls, config: KVTransferConfig) -> None:
        """Refuses, naming the field, what the connector cannot be."""
        if cls.USES_NIXL:
            try:
                nixl_api()
            except ImportError as exc:
                raise InvalidRequestError(str(exc), param="kv_transfer_config.kv_connector") from None
        extra = settings(config)
        if unknown := sorted(set(extra) - set(DEFAULTS)):
            raise InvalidRequestError(
                f"{EXTRA}.{unknown[0]} is not a {cls.__name__} setting (settings: {', '.join(DEFAULTS)})",
                param=f"{EXTRA}.{unknown[0]}",
            )
        if not isinstance(extra["side_channel_host"], str) or not extra["side_channel_host"]:
            raise InvalidRequestError(
                f"{EXTRA}.side_channel_host must be a host name or address", param=f"{EXTRA}.side_channel_host"
            )
        port = extra["side_channel_port"]
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidRequestError(
                f"{EXTRA}.side_channel_port must be a port number (0: any free)", param=f"{EXTRA}.side_channel_port"
            )
        for name in ("hold_timeout", "pull_timeout"):
            value = extra[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidRequestError(
                    f"{EXTRA}.{name} must be seconds, above 0, got {value!r}", param=f"{EXTRA}.{name}"
                )

    @classmethod
    def worker(
        cls,
        config: KVTransferConfig,
        block_bytes: int,
        block_shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
    ) -> tuple[TransferWorker, int]:
        """The worker half (its side channel bound now: a port in use fails the start); no blocks of its own."""
        from argosy.server.kv_transfer.transfer_worker import TransferWorker

        extra = settings(config)
        host, port = extra["side_channel_host"], extra["side_channel_port"]
        return TransferWorker(block_shape, dtype, device, host, port, float(extra["pull_timeout"]), cls.USES_NIXL), 0

    @staticmethod
    def scheduler(
        config: KVTransferConfig, num_blocks: int, block_size: int, address: SideChannelAddress
    ) -> TransferScheduler:
        return TransferScheduler(address, block_size, float(settings(config)["hold_timeout"]))


class NixlConnector(ZmqConnector):
    USES_NIXL = True
