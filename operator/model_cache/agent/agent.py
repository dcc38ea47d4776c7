"""Agent: one node's copies of the ModelCaches that select it. Each pass reads the node, the
ModelCaches and the pods on the node, then, for each ModelCache that selects the node (pinned
first, then oldest first), decides one thing (decide.py): its copy is ready, under way, waiting
out a failed attempt's delay, waiting for room, or started now. It writes each one's entry in
its ModelCache's status (its own node's entry only: agents never write each other's), labels
the node for each ready copy, and drops its entries from ModelCaches that stopped selecting it.
Copies run on threads of their own, a few at once; the pass never waits for one."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from argosy.operator.kinds import MODEL_CACHE, NODE, POD
from argosy.operator.kube import KubeClient
from argosy.operator.model_cache.agent.copier import Stopped, copy_files
from argosy.operator.model_cache.agent.decide import Attempt, Decision, decide, quota_view
from argosy.operator.model_cache.agent.manifest import Manifest, ManifestError
from argosy.operator.model_cache.agent.source_for import SourceFor
from argosy.operator.model_cache.agent.sources import FetchError, read_whole
from argosy.operator.model_cache.agent.store import CacheStore
from argosy.operator.model_cache.nodes import LABEL_PREFIX, READY, ready_label, selects
from argosy.operator.model_cache.spec import ModelCacheSpec
from argosy.operator.status import now

log = logging.getLogger("argosy.agent")
PROGRESS_REPORT_SECONDS = 2.0  # progress alone is written at most this often


@dataclass
class AgentConfig:
    node_name: str
    cache_root: Path
    quota_bytes: int = 0  # 0: no quota
    library_root: Path = Path("/libraries")  # where the library claims are mounted, one folder each
    parallel_copies: int = 2
    retry_base_seconds: float = 10.0
    retry_max_seconds: float = 600.0


class Agent:
    def __init__(self, kube: KubeClient, config: AgentConfig):
        self.kube, self.config = kube, config
        self.store = CacheStore(config.cache_root)
        self.sources = SourceFor(kube, config.library_root)
        self.attempts: dict[str, Attempt] = {}  # by "namespace/name"
        self.reported: dict[str, tuple[dict[str, Any], float]] = {}  # each entry last written, and when

    def run_once(self) -> None:
        name = self.config.node_name
        node = self.kube.get(NODE, None, name)
        if node is None:
            raise RuntimeError(f"node {name} not found")
        caches = self.kube.list(MODEL_CACHE, None)
        pods = [p for p in self.kube.list(POD, None, field_selector=f"spec.nodeName={name}") if _running_on(p, name)]
        in_use = self._in_use(pods)
        for key in in_use:
            self.store.touch(key)
        wanted = {}
        for cache in caches:
            spec = _spec(cache)
            if spec is not None and selects(spec, node):
                wanted[_key(cache)] = (cache, spec)
        for key in {*self.attempts, *self.store.staged_keys()} - wanted.keys():  # no longer selects the node
            self._drop(key)
        ready = set()
        order = sorted(wanted, key=lambda k: (not wanted[k][1].pinned, _created(wanted[k][0]), k))
        for key in order:
            cache, spec = wanted[key]
            entry = self._step(key, cache, spec, wanted, in_use)
            if entry["phase"] == "Ready":
                ready.add(key)
            self._report(key, entry)
        for cache in caches:
            if _key(cache) not in wanted and name in ((cache.get("status") or {}).get("nodes") or {}):
                self._write(_key(cache), None)
        self._label(node, ready)

    def _step(self, key: str, cache: dict, spec: ModelCacheSpec, wanted: dict, in_use: set[str]) -> dict[str, Any]:
        generation = cache["metadata"].get("generation", 1)
        attempt = self.attempts.get(key)
        if attempt is not None and attempt.generation != generation:
            # The spec changed under it: a new attempt reads the manifest again and resumes what
            # is staged (a staged file of other content fails its check and is fetched again).
            self.attempts.pop(key).halt()
            attempt = None
        if attempt is None:
            attempt = self.attempts[key] = Attempt(generation)
        if attempt.manifest is None and time.monotonic() >= attempt.retry_at:
            try:
                attempt.manifest = self._manifest(cache, spec)
            except (FetchError, ManifestError) as exc:
                attempt.count += 1
                attempt.failed(FetchError(getattr(exc, "reason", "ManifestInvalid"), str(exc)), self.config)
        held = {c.key: c for c in self.store.copies()}
        pinned = {k: s.pinned for k, (_, s) in wanted.items()}
        others = quota_view(key, held, pinned, in_use, self.attempts)
        running = sum(1 for a in self.attempts.values() if a.running)
        decision = decide(key, attempt, spec.pinned, held, others, in_use, running, self.config, time.monotonic())
        for victim in decision.evict:
            self._evict(victim, key)
        if decision.finish:
            self.store.finish(key, attempt.manifest)
            attempt.copied = False
        if decision.start:
            self._start(key, attempt, cache, spec)
        return self._entry(decision, attempt, generation)

    def _manifest(self, cache: dict, spec: ModelCacheSpec) -> Manifest:
        if spec.files is not None:
            return Manifest.of(spec.files)
        source = self.sources(spec, cache["metadata"]["namespace"])
        return Manifest.from_json(read_whole(source, spec.manifestPath))

    def _start(self, key: str, attempt: Attempt, cache: dict, spec: ModelCacheSpec) -> None:
        attempt.begin()

        def copy() -> None:
            try:
                source = self.sources(spec, cache["metadata"]["namespace"])
                copy_files(attempt.manifest, source, self.store.staging(key), attempt.progress, attempt.stop)
            except Stopped:
                return
            except FetchError as exc:
                attempt.failed(exc, self.config)
            except OSError as exc:
                attempt.failed(FetchError("DiskError", str(exc)), self.config)
            else:
                attempt.copied = True
            finally:
                log.info("copy of %s ended: %s", key, attempt.error.message if attempt.error else "copied")

        attempt.thread = threading.Thread(target=copy, name=f"copy-{key}", daemon=True)
        attempt.thread.start()

    def _drop(self, key: str) -> None:
        attempt = self.attempts.pop(key, None)
        if attempt is not None:
            attempt.halt()
        self.store.discard_staging(key)

    def _evict(self, victim: str, for_key: str) -> None:
        if victim in self.attempts or victim in self.reported:  # a wanted copy, evicted for a pinned one
            self._write(victim, {"phase": "Evicting", "reason": "Preempted", "message": f"room for {for_key}"})
        self.store.evict(victim)
        log.info("evicted %s to make room for %s", victim, for_key)

    def _entry(self, decision: Decision, attempt: Attempt, generation: int) -> dict[str, Any]:
        total = attempt.manifest.total if attempt.manifest is not None else 0
        progress = attempt.progress
        moving = progress is not None and decision.phase in ("Copying", "Verifying")
        done = total if decision.phase == "Ready" else (progress.done if progress is not None else 0)
        return {
            "phase": decision.phase,
            "bytesDone": done,
            "bytesTotal": total,
            "bytesPerSecond": progress.rate if moving else 0,
            "attempts": attempt.count,
            "reason": decision.reason,
            "message": decision.message,
            "observedGeneration": generation,
        }

    def _report(self, key: str, entry: dict[str, Any]) -> None:
        """Writes the entry when it changed, progress alone at most every few seconds."""
        last, when = self.reported.get(key, ({}, 0.0))
        before = _without_time(last)
        if _without_progress(entry) == _without_progress(before) and (
            entry == before or time.monotonic() - when < PROGRESS_REPORT_SECONDS
        ):
            return
        changed_phase = entry["phase"] != last.get("phase")
        entry["lastTransitionTime"] = now() if changed_phase else last.get("lastTransitionTime", now())
        self._write(key, entry)

    def _write(self, key: str, entry: dict[str, Any] | None) -> None:
        namespace, name = key.split("/", 1)
        body = {"status": {"nodes": {self.config.node_name: entry}}}
        try:
            self.kube.patch(MODEL_CACHE, namespace, name, body, subresource="status")
        except ApiException as exc:
            if exc.status != 404:  # a ModelCache deleted meanwhile has nothing to report to
                raise
        if entry is None:
            self.reported.pop(key, None)
        else:
            self.reported[key] = (entry, time.monotonic())

    def _label(self, node: dict, ready: set[str]) -> None:
        labels = (node.get("metadata") or {}).get("labels") or {}
        mine = {k for k in labels if k.startswith(f"{LABEL_PREFIX}/")}
        want = {ready_label(*key.split("/", 1)) for key in ready}
        change = {k: READY for k in want if labels.get(k) != READY} | dict.fromkeys(mine - want)
        if change:
            self.kube.patch(NODE, None, self.config.node_name, {"metadata": {"labels": change}})

    def _in_use(self, pods: list[dict]) -> set[str]:
        """The copies the pods on the node mount (a hostPath at or under a copy's folder)."""
        root = str(self.store.root).rstrip("/") + "/"
        keys = set()
        for pod in pods:
            for volume in (pod.get("spec") or {}).get("volumes") or []:
                path = ((volume.get("hostPath") or {}).get("path") or "").rstrip("/") + "/"
                parts = path[len(root) :].split("/") if path.startswith(root) else []
                if len(parts) >= 3 and parts[1]:
                    keys.add(f"{parts[0]}/{parts[1]}")
        return keys

    def close(self) -> None:
        for key in list(self.attempts):
            attempt = self.attempts.pop(key)
            attempt.halt()


def _spec(cache: dict) -> ModelCacheSpec | None:
    try:
        return ModelCacheSpec.model_validate(cache.get("spec") or {})
    except ValidationError:
        return None  # the CRD's schema stops these; one that slips through is left alone


def _key(obj: dict) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _created(obj: dict) -> str:
    return obj["metadata"].get("creationTimestamp") or ""


def _running_on(pod: dict, node: str) -> bool:
    return (pod.get("spec") or {}).get("nodeName") == node and (pod.get("status") or {}).get("phase") not in (
        "Succeeded",
        "Failed",
    )


def _without_time(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "lastTransitionTime"}


def _without_progress(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in ("bytesDone", "bytesPerSecond")}
