"""The ModelCache spec as typed models, the one source of its CRD's schema: where the files come
from, which files (with sizes and SHA-256), and which nodes hold a copy."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from argosy.operator.kube_types import KubeModel, SecretKeyRef, Toleration, cel, rules
from argosy.operator.spec import relative_path_field

SHA256_PATTERN = "^[0-9a-f]{64}$"


def relative_path(field_path: str, description: str, default=...):
    return relative_path_field(field_path, description, default, max_length=1024)


class HttpSource(KubeModel):
    """Files under an HTTP(S) base URL: an object store, or a model hub's file URLs (a file's URL
    is the base URL, '/', and its path)."""

    url: str = Field(pattern="^https?://[^\\s]+$", max_length=2048, description="The base URL.")
    bearerTokenSecretRef: SecretKeyRef | None = Field(
        None, description="A Secret key (in this namespace) holding a bearer token sent with every request."
    )


class ClaimSource(KubeModel):
    """A folder on a read-only library PersistentVolumeClaim in the agent's namespace, which
    the agent mounts (the chart's agent.libraryClaims)."""

    claimName: str = Field(min_length=1, max_length=253, description="Name of the claim.")
    path: str = relative_path("spec.source.persistentVolumeClaim.path", "The folder on the claim.")


class NodeSource(KubeModel):
    """A folder in another node's cache root, which that node's agent serves to the others."""

    name: str = Field(min_length=1, max_length=253, description="Name of the node.")
    path: str = relative_path("spec.source.node.path", "The folder, relative to that node's cache root.")


class CacheSource(KubeModel):
    """Where the files come from: exactly one of http, persistentVolumeClaim, node."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "[has(self.http), has(self.persistentVolumeClaim), has(self.node)].filter(x, x).size() == 1",
                "spec.source needs exactly one of http, persistentVolumeClaim, node",
            )
        )
    )

    http: HttpSource | None = None
    persistentVolumeClaim: ClaimSource | None = None
    node: NodeSource | None = None


class CacheFile(KubeModel):
    """One file of the copy, checked by size and SHA-256 before the copy is ready."""

    path: str = relative_path("spec.files[].path", "The file, relative to the source (and to the copy).")
    size: int = Field(ge=0, json_schema_extra={"format": "int64"}, description="Its size in bytes.")
    sha256: str = Field(pattern=SHA256_PATTERN, description="Its SHA-256, in lowercase hex.")


class ModelCacheSpec(KubeModel):
    """A checkpoint copied onto the local disks of the nodes that select it."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "has(self.files) != has(self.manifestPath)",
                "spec needs exactly one of files (the manifest inline) and manifestPath (read from the source)",
            )
        )
    )

    source: CacheSource
    files: list[CacheFile] | None = Field(
        None, min_length=1, max_length=4096, description="The files to copy: the manifest, inline."
    )
    manifestPath: str | None = relative_path(
        "spec.manifestPath",
        'A manifest at the source ({"files": [{path, size, sha256}]}, as `argosy agent manifest` writes it).',
        None,
    )
    nodeSelector: dict[str, str] = Field(
        default_factory=dict, description="Labels of the nodes that hold a copy; empty: every node with an agent."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints of nodes that may still hold a copy (as a pod's tolerations)."
    )
    pinned: bool = Field(
        False,
        description=(
            "Pinned copies come first: when a node's quota is short, copies of unpinned ModelCaches that no pod on "
            "the node uses are evicted to make room for a pinned one, and a pinned copy is never evicted."
        ),
    )
