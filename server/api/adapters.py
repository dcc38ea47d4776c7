"""ServedAdapters: the API process's side of LoRA. It loads and unloads adapters by name (from
`--lora-modules`, the endpoints, or the watched adapters file; ServerState resolves a request's
`model` through its registry) and tells the engine core: a load reads the adapter into host
memory there; an unload retires its weights once no name stands for them, and requests in
flight finish on them first.

AdaptersFileWatcher polls `--lora-config-file` and applies what changed in it; a bad entry is
logged and counted, and the others still apply."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from argosy.server.api.server_config import ServerConfig
from argosy.server.exceptions import InvalidRequestError
from argosy.server.lora.adapter_folder import CONFIG_FILE, WEIGHTS_FILE
from argosy.server.lora.config_file import parse_adapters
from argosy.server.lora.registry import AdapterRegistry
from argosy.server.lora.request import AdapterRef
from argosy.server.models.default_model import resolve_model_path
from argosy.server.models.model_config import ModelConfig

log = logging.getLogger("argosy.api")
WATCH_INTERVAL_SECONDS = 2.0


class ServedAdapters:
    def __init__(
        self,
        registry: AdapterRegistry,
        load: Callable[[AdapterRef], None],
        retire: Callable[[str], None],
    ):
        self.registry, self._load, self._retire = registry, load, retire

    async def load(self, name: str, path: str, replace: bool = False) -> AdapterRef:
        """The folder is read in a thread; the engine core is told from the event loop, which
        alone writes to its socket (in order: a load never overtakes an earlier retire)."""
        ref, old = await asyncio.to_thread(self.registry.register, name, path, replace)
        self._load(ref)
        if old is not None and old.digest != ref.digest:
            self._retire_unserved(old)
        return ref

    def unload(self, name: str) -> AdapterRef:
        ref = self.registry.unregister(name)
        self._retire_unserved(ref)
        return ref

    def _retire_unserved(self, ref: AdapterRef) -> None:
        if not self.registry.is_served(ref.digest):
            self._retire(ref.digest)


def parse_lora_module(text: str) -> tuple[str, str]:
    """A `--lora-modules` value: NAME=PATH, or vLLM's JSON {"name": ..., "path": ...}."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
            return str(data["name"]), str(data["path"])
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRequestError(f'--lora-modules {text!r}: expected {{"name": ..., "path": ...}}') from exc
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise InvalidRequestError(f"--lora-modules {text!r}: expected NAME=PATH", param="lora_modules")
    return name, path


class AdaptersFileWatcher:
    """Keeps the adapters the file lists served, and no others it listed before."""

    def __init__(self, path: str, adapters: ServedAdapters, on_error: Callable[[str], None]):
        self.path, self.adapters, self.on_error = path, adapters, on_error
        # name -> (path, its files' mtimes and sizes) as last loaded, or as last failed to load
        self.applied: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        self.failed: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        self._text: str | None = None

    async def run(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(WATCH_INTERVAL_SECONDS)

    async def sync(self) -> None:
        """Reads the file once and applies what changed since the last read."""
        try:
            text = await asyncio.to_thread(Path(self.path).read_text)
            known = [*self.applied.values(), *self.failed.values()]
            if text == self._text and all(_stamp(p) == s for p, s in known):
                return
            listed = parse_adapters(text)
        except (OSError, ValueError) as exc:
            self._report(f"{self.path}: {exc}; the adapters stay as they are")
            return
        self._text = text
        for message in listed.errors:
            self._report(f"{self.path}: {message}")
        wanted = {entry.name for entry in listed.entries}
        self.failed = {name: seen for name, seen in self.failed.items() if name in wanted}
        for name in [n for n in self.applied if n not in wanted]:
            del self.applied[name]
            await self._apply(name, "unloaded", self._unload(name))
        for entry in listed.entries:
            seen = (entry.path, _stamp(entry.path))
            if self.applied.get(entry.name) == seen or self.failed.get(entry.name) == seen:
                continue
            # Listed before (or loaded another way): the file's entry replaces it.
            loaded = await self._apply(entry.name, "loaded", self.adapters.load(entry.name, entry.path, True))
            (self.applied if loaded else self.failed)[entry.name] = seen
            (self.failed if loaded else self.applied).pop(entry.name, None)

    async def _unload(self, name: str) -> None:
        self.adapters.unload(name)

    async def _apply(self, name: str, what: str, change: Awaitable[object]) -> bool:
        try:
            await change
        except Exception as exc:  # one entry's failure never stops the others
            self._report(f"{self.path}: adapter {name!r}: {exc}")
            return False
        log.info("adapters file %s: adapter %s %s", self.path, name, what)
        return True

    def _report(self, message: str) -> None:
        log.error("%s", message)
        self.on_error(message)


def _stamp(path: str) -> tuple[int, ...] | None:
    """When the adapter's files last changed, and their sizes: a change is checked by its digest."""
    try:
        files = [os.stat(Path(path) / name) for name in (WEIGHTS_FILE, CONFIG_FILE)]
    except OSError:
        return None
    return tuple(n for st in files for n in (st.st_mtime_ns, st.st_size))


def startup_adapters(config: ServerConfig) -> AdapterRegistry | None:
    """With LoRA on, the registry with the `--lora-modules` adapters in it (each checked: a bad
    one stops the start, naming it); None with LoRA off."""
    engine = config.engine
    if not engine.enable_lora:
        return None
    model = ModelConfig.from_folder(resolve_model_path(engine.model))
    registry = AdapterRegistry(model, engine.max_lora_rank, config.model_name)
    for text in config.lora_modules:
        name, path = parse_lora_module(text)
        try:
            registry.register(name, path)
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"--lora-modules {name}: {exc}", param="lora_modules") from exc
    return registry
