"""HostTierConnector: the host tier (`--swap-space`, or `--kv-transfer-config
{"kv_connector": "HostTierConnector", "kv_connector_extra_config": {"swap_space": GiB}}`) as a KV
connector: each half made where it lives, the worker's first (it sizes the slots from its block's
bytes), the engine's from the slots the workers report."""

from __future__ import annotations

from typing import TYPE_CHECKING

from argosy.server.exceptions import InvalidRequestError
from argosy.server.kv_connector.config import KVTransferConfig
from argosy.server.kv_tier.tier_scheduler import HostTierScheduler, swap_space_of

if TYPE_CHECKING:
    import torch

    from argosy.server.kv_tier.tier_worker import HostTierWorker


class HostTierConnector:
    @staticmethod
    def check(config: KVTransferConfig) -> None:
        """Refuses, naming the field, what the host tier cannot be."""
        swap = config.kv_connector_extra_config.get("swap_space")
        if isinstance(swap, bool) or not isinstance(swap, int | float) or swap <= 0:
            name = "kv_transfer_config.kv_connector_extra_config.swap_space"
            raise InvalidRequestError(f"{name} must be the host tier's GiB, above 0, got {swap!r}", param=name)
        if config.kv_role != "kv_both":
            name = "kv_transfer_config.kv_role"
            raise InvalidRequestError(f"the host tier both saves and loads: {name} must be kv_both", param=name)

    @staticmethod
    def worker(
        config: KVTransferConfig,
        block_bytes: int,
        block_shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
    ) -> tuple[HostTierWorker | None, int]:
        """The worker half and its slots (none, and no half, when the space holds no block)."""
        from argosy.server.kv_tier.tier_worker import HostTierWorker

        num_slots = int(swap_space_of(config) * (1 << 30)) // block_bytes
        return (HostTierWorker(num_slots, block_shape, dtype, device) if num_slots else None), num_slots

    @staticmethod
    def scheduler(
        config: KVTransferConfig, num_blocks: int, block_size: int, address: None
    ) -> HostTierScheduler | None:
        return HostTierScheduler(num_blocks, block_size) if num_blocks else None
