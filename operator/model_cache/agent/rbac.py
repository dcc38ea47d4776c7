"""The agent's API permissions: one table that the chart's agent ClusterRole and its tests use,
matching the calls in agent.py, source_for.py and main.py. Cluster-wide: a node's agent holds
copies of ModelCaches of every namespace, and reads the pods of its node in all of them."""

from __future__ import annotations

from argosy.operator.kinds import MODEL_CACHE, NODE, POD, SECRET
from argosy.operator.rbac import Rule

AGENT_RULES: list[Rule] = [
    (MODEL_CACHE.group, (MODEL_CACHE.plural,), ("list",)),
    (MODEL_CACHE.group, (f"{MODEL_CACHE.plural}/status",), ("patch",)),  # its own node's entries
    (NODE.group, (NODE.plural,), ("get", "patch")),  # its node's ready labels; a peer's address
    (POD.group, (POD.plural,), ("list",)),  # which copies the pods on its node use
    (SECRET.group, (SECRET.plural,), ("get",)),  # an HTTP source's bearer token
]
