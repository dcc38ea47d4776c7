"""SourceFor: the FileSource a ModelCache's spec names, with what it needs from the cluster (a
bearer token's Secret, the peer node's agent address) and from the agent's own mounts."""

from __future__ import annotations

import base64
from pathlib import Path

from argosy.operator.kinds import NODE, SECRET
from argosy.operator.kube import KubeClient
from argosy.operator.model_cache.agent.sources import FetchError, FileSource, FolderSource, HttpSource
from argosy.operator.model_cache.nodes import AGENT_ADDRESS
from argosy.operator.model_cache.spec import ModelCacheSpec


class SourceFor:
    def __init__(self, kube: KubeClient, library_root: Path):
        self.kube, self.library_root = kube, library_root

    def __call__(self, spec: ModelCacheSpec, namespace: str) -> FileSource:
        source = spec.source
        if source.http is not None:
            ref = source.http.bearerTokenSecretRef
            return HttpSource(source.http.url, None if ref is None else self._secret(namespace, ref.name, ref.key))
        if source.persistentVolumeClaim is not None:
            claim = source.persistentVolumeClaim
            mount = self.library_root / claim.claimName
            if not mount.is_dir():
                raise FetchError(
                    "ClaimNotMounted",
                    f"the agent does not mount the claim {claim.claimName}: list it in the chart's agent.libraryClaims",
                )
            return FolderSource(mount / claim.path)
        peer = source.node
        node = self.kube.get(NODE, None, peer.name)
        address = ((node or {}).get("metadata", {}).get("annotations") or {}).get(AGENT_ADDRESS)
        if address is None:
            raise FetchError("PeerUnavailable", f"node {peer.name} has no agent serving copies ({AGENT_ADDRESS})")
        return HttpSource(f"http://{address}/{peer.path}")

    def _secret(self, namespace: str, name: str, key: str) -> str:
        secret = self.kube.get(SECRET, namespace, name)
        value = ((secret or {}).get("data") or {}).get(key)
        if value is None:
            raise FetchError("SecretNotFound", f"Secret {namespace}/{name} has no key {key!r}")
        return base64.b64decode(value).decode().strip()
