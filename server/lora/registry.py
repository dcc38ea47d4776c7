"""AdapterRegistry: the adapters served, by the name a request gives as its `model`. Registering
checks the folder against the base model (no tensor is loaded) and fixes the digest that the
name stands for until it is registered again; the engine core is handed that AdapterRef, so a
request runs on the weights its name stood for when it arrived, whatever happens to the name
afterwards."""

from __future__ import annotations

import threading

from argosy.server.exceptions import ConflictError, InvalidRequestError, NotFoundError
from argosy.server.lora.adapter_folder import inspect_adapter
from argosy.server.lora.request import NAME, AdapterRef
from argosy.server.models.model_config import ModelConfig


class AdapterRegistry:
    def __init__(self, model: ModelConfig, max_rank: int, base_name: str):
        self.model, self.max_rank, self.base_name = model, max_rank, base_name
        self.refs: dict[str, AdapterRef] = {}
        self._lock = threading.Lock()  # registering reads the folder off the event loop, maybe twice at once

    def get(self, name: str) -> AdapterRef | None:
        return self.refs.get(name)

    def register(self, name: str, path: str, replace: bool = False) -> tuple[AdapterRef, AdapterRef | None]:
        """The adapter at `path` served as `name` from now on; returns it and the one it replaces.
        Raises AdapterError (400) for a folder that cannot be served, ConflictError (409) for a
        name in use without `replace`."""
        if not isinstance(name, str) or not NAME.match(name):
            raise InvalidRequestError(
                f"adapter name {name!r} is not a valid model name (letters, digits and . _ : / -, at most 253)",
                param="lora_name",
            )
        if name == self.base_name:
            raise InvalidRequestError(f"adapter name {name!r} is the base model's name", param="lora_name")
        self._check_free(name, replace)
        folder = inspect_adapter(path, self.model, self.max_rank)
        ref = AdapterRef(name, str(folder.path), folder.digest)
        with self._lock:
            self._check_free(name, replace)
            old = self.refs.get(name)
            self.refs[name] = ref
        return ref, old

    def _check_free(self, name: str, replace: bool) -> None:
        if name in self.refs and not replace:
            raise ConflictError(
                f"adapter {name!r} is already loaded; unload it first, or load with load_inplace", param="lora_name"
            )

    def unregister(self, name: str) -> AdapterRef:
        """Raises NotFoundError (404) for a name not served."""
        ref = self.refs.pop(name, None)
        if ref is None:
            raise NotFoundError(f"adapter {name!r} is not loaded", param="lora_name")
        return ref

    def is_served(self, digest: str) -> bool:
        """Some name still stands for these weights."""
        return any(ref.digest == digest for ref in self.refs.values())
