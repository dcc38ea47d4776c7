"""kmock's Kubernetes emulator with the API-server semantics the operator relies on: object
identity (uid, resourceVersion, generation, creationTimestamp), the status subresource,
JSON patches with failing tests answered 422, PUT, label selectors, watches that resume
from a resourceVersion, pods that terminate before they are gone, and garbage collection through
ownerReferences."""

from __future__ import annotations

import copy
import datetime
import itertools
import re
import uuid
from typing import Any, ClassVar

import aiohttp.web
import jsonpatch
import kmock
from kmock._internal import apps, enums
from kmock._internal.k8s import (
    KubernetesError,
    KubernetesObjectConflictError,
    KubernetesObjectNotFoundError,
    KubernetesResourceNotFoundError,
)

NOT_SPEC = ("metadata", "status", "apiVersion", "kind")


class ClusterEmulator(kmock.KubernetesEmulator):
    _versions = itertools.count(1)
    # (HTTP method, plural) -> status to answer instead, for tests of API failures
    failures: ClassVar[dict[tuple[str, str], int]] = {}

    def has_status_subresource(self, resource) -> bool:
        info = self.resources[resource] if resource in list(self._resources) else None
        return info is not None and "status" in info.subresources

    async def _handle(self, request):
        failure = request.resource and self.failures.get((request.method.value, request.resource.plural))
        if failure:
            raise KubernetesError(status=failure, reason="InternalError", message="injected failure")
        if request.resource is not None and request.subresource == "scale":
            async with self._lock:
                return aiohttp.web.json_response(await self._scale(request))
        if request.resource is None or (
            request.action in (enums.action.LIST, enums.action.WATCH, enums.action.FETCH) and request.method != "PUT"
        ):
            return await apps.RawHandler._handle(self, request)
        if not any(request.resource == declared for declared in self.resources):
            raise KubernetesResourceNotFoundError()  # e.g. a CRD that is not installed
        async with self._lock:
            if request.method == "PUT" and request.name:
                obj = await self._replace(request)
            elif request.action == enums.action.CREATE:
                obj = await self._create(request)
            elif request.action == enums.action.UPDATE and request.name:
                obj = await self._patch(request)
            elif request.action == enums.action.DELETE and request.name:
                obj = await self._delete(request.resource, request.namespace, request.name)
            else:
                return await apps.RawHandler._handle(self, request)
        return aiohttp.web.json_response(obj)

    def _stamp(self, meta: dict[str, Any]) -> None:
        meta["resourceVersion"] = str(next(self._versions))

    async def _create(self, request) -> dict[str, Any]:
        obj = copy.deepcopy(request.data)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", request.namespace)
        if request.namespace is None:
            meta.pop("namespace")
        if "name" not in meta and "generateName" in meta:
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        key = (request.resource, meta.get("namespace"), meta["name"])
        if key in self._objects and not self._objects[key].deleted:
            raise KubernetesObjectConflictError()
        meta.update(
            uid=str(uuid.uuid4()),
            generation=1,
            creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        self._stamp(meta)
        if self.has_status_subresource(request.resource):
            obj.pop("status", None)
        if key in self._objects:
            self._objects[key].create(obj)
        else:
            self._objects[key] = obj
        await self._buses[request.resource].put({"type": "ADDED", "object": obj})
        return obj

    def _existing(self, resource, namespace, name) -> dict[str, Any]:
        key = (resource, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            raise KubernetesObjectNotFoundError()
        return copy.deepcopy(self._objects[key].raw)

    async def _patch(self, request) -> dict[str, Any]:
        current = self._existing(request.resource, request.namespace, request.name)
        try:
            patched = (
                jsonpatch.apply_patch(current, request.data)
                if isinstance(request.data, list)
                else _merge(current, request.data)
            )
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc
        if request.subresource == "status":
            new = {**current, "status": patched.get("status")}
        else:
            new = patched
            if self.has_status_subresource(request.resource) and "status" in current:
                new["status"] = current["status"]
        return await self._store(request.resource, current, new)

    async def _scale(self, request) -> dict[str, Any]:
        """The scale subresource (spec.replicas, status.replicas, status.selector), as the
        CRD's scale paths declare it; `kubectl scale` reads and patches it."""
        current = self._existing(request.resource, request.namespace, request.name)
        if request.method.value in ("PATCH", "PUT"):
            replicas = (request.data.get("spec") or {}).get("replicas")
            new = copy.deepcopy(current)
            new["spec"] = {**new.get("spec", {}), "replicas": replicas}
            current = await self._store(request.resource, current, new)
        meta = current["metadata"]
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion")},
            "spec": {"replicas": current.get("spec", {}).get("replicas", 0)},
            "status": {
                "replicas": (current.get("status") or {}).get("replicas", 0),
                "selector": (current.get("status") or {}).get("selector", ""),
            },
        }

    async def _replace(self, request) -> dict[str, Any]:
        current = self._existing(request.resource, request.namespace, request.name)
        new = copy.deepcopy(request.data)
        new["metadata"] = {
            **new.get("metadata", {}),
            **{k: current["metadata"][k] for k in ("uid", "creationTimestamp", "generation")},
        }
        return await self._store(request.resource, current, new)

    async def _store(self, resource, current: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        meta = new.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "name", "namespace"):
            if key in current["metadata"]:
                meta[key] = current["metadata"][key]
        changed = any(new.get(k) != current.get(k) for k in set(new) | set(current) if k not in NOT_SPEC)
        meta["generation"] = current["metadata"].get("generation", 1) + int(changed)
        self._stamp(meta)
        key = (resource, meta.get("namespace"), meta["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._objects[key].create(new)
            await self._remove(key)
        else:
            self._objects[key].create(new)
            await self._buses[resource].put({"type": "MODIFIED", "object": new})
        return new

    async def _delete(self, resource, namespace, name) -> dict[str, Any]:
        current = self._existing(resource, namespace, name)
        if current["metadata"].get("deletionTimestamp"):
            return current
        # A pod terminates gracefully: watchers see it marked for deletion before it is gone, and
        # some (the vLLM router's pod discovery) act on that mark alone.
        if current["metadata"].get("finalizers") or resource.plural == "pods":
            current["metadata"]["deletionTimestamp"] = datetime.datetime.now(datetime.UTC).isoformat()
            self._stamp(current["metadata"])
            self._objects[resource, namespace, name].create(current)
            await self._buses[resource].put({"type": "MODIFIED", "object": current})
        if not current["metadata"].get("finalizers"):
            await self._remove((resource, namespace, name))
        return current

    async def _remove(self, key) -> None:
        """Deletes an object, then (as the garbage collector would) every object it owns."""
        obj = self._objects[key]
        raw = copy.deepcopy(obj.raw)
        obj.delete()
        await self._buses[key[0]].put({"type": "DELETED", "object": raw})
        uid = raw["metadata"].get("uid")
        for (resource, namespace, name), child in list(self._objects.items()):
            if not child.deleted and any(
                ref.get("uid") == uid for ref in child.raw.get("metadata", {}).get("ownerReferences", [])
            ):
                await self._delete(resource, namespace, name)

    async def _serve_list(self, request):
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        result["items"] = [obj for obj in result["items"] if matches(selector, obj)]
        result["metadata"]["resourceVersion"] = str(next(self._versions))
        return result

    async def _serve_watch(self, request):
        selector = request.params.get("labelSelector")
        since = int(request.params.get("resourceVersion") or 0)
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict):
                yield event
                continue
            meta = event.get("object", {}).get("metadata", {})
            if int(meta.get("resourceVersion") or 0) > since and matches(selector, event["object"]):
                yield event


def matches(selector: str | None, obj: dict[str, Any]) -> bool:
    """Equality, set and existence label selectors: `a=b,c!=d,e in (f,g),h notin (i),j,!k`."""
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in (t.strip() for t in re.split(r",(?![^()]*\))", selector or "") if t.strip()):
        if found := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term):
            key, operator, values = found.groups()
            inside = labels.get(key) in {v.strip() for v in values.split(",")}
            if inside != (operator == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result
