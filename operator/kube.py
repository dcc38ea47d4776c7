"""KubeClient: the few Kubernetes API calls the operator makes, for any kind (kinds.py), through
the official client. The verbs used here are exactly those in `argosy.operator.rbac.RULES`."""

from __future__ import annotations

import os
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from argosy.operator.kinds import Kind

# (connect, read) seconds: a hung connection must not hold a service's reconcile lock forever.
REQUEST_TIMEOUT = (5, 30)


class KindNotInstalled(Exception):
    """The API server does not serve this kind (e.g. KEDA's CRDs are absent)."""


class KubeClient:
    def __init__(self, api: client.ApiClient):
        self.api = api

    @classmethod
    def from_environment(cls) -> KubeClient:
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            # The client reads $KUBECONFIG only when imported; read it now.
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
        return cls(client.ApiClient(configuration))

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None; namespace None for a cluster-scoped kind."""
        try:
            return self._call("GET", kind.path(namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, kind: Kind, namespace: str | None, label_selector: str = "", field_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Objects of a namespace (None: of every namespace, or of a cluster-scoped kind)."""
        query = [(key, value) for key, value in (("labelSelector", label_selector), ("fieldSelector", field_selector))]
        return self._call("GET", kind.path(namespace), query=[q for q in query if q[1]])["items"]

    def create(self, kind: Kind, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._call("POST", kind.path(body["metadata"]["namespace"]), body=body)
        except ApiException as exc:
            if exc.status == 404:  # the collection itself is missing
                raise KindNotInstalled(f"{kind.plural}.{kind.group or 'core'}/{kind.version}") from exc
            raise

    def patch(
        self, kind: Kind, namespace: str | None, name: str, body: dict[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        return self._call(
            "PATCH", kind.path(namespace, name, subresource), body=body, content_type="application/merge-patch+json"
        )

    def delete(self, kind: Kind, namespace: str, name: str) -> None:
        try:
            self._call("DELETE", kind.path(namespace, name))
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list | None = None,
        content_type: str = "application/json",
    ) -> Any:
        request = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            body=body,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=REQUEST_TIMEOUT)
        response.read()
        # Raises ApiException (with .status) for anything but 2xx.
        return self.api.response_deserialize(response, {"2XX": "object"}).data
