"""KVConnectorMeta: every connector's per-step metadata, one tagged type each, as step plans carry
it (plain data: msgspec structs)."""

from __future__ import annotations

from argosy.server.kv_tier.tier_scheduler import HostTierMeta
from argosy.server.kv_transfer.transfer_scheduler import TransferMeta

KVConnectorMeta = HostTierMeta | TransferMeta
