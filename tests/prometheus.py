"""A real Prometheus on loopback, scraping targets with the labels a Kubernetes pod scrape
attaches, and instant queries against it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml

from tests.processes import free_port, running


@contextmanager
def prometheus_scraping(folder: Path, targets: list[tuple[str, str, str]]) -> Iterator[str]:
    """Prometheus scraping each (url, namespace, pod) every second, as the pod `pod` of
    `namespace`; yields its URL."""
    binary = shutil.which("prometheus")
    assert binary, "Prometheus is not installed: apt-get install -y prometheus (the README's test command does)"
    # What a `kubernetes_sd_configs: [{role: pod}]` job yields before relabelling, and the
    # relabelling every pod scrape applies (a PodMonitor does the same).
    static = [
        {
            "targets": [url.removeprefix("http://")],
            "labels": {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod},
        }
        for url, namespace, pod in targets
    ]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "static_configs": static,
                "relabel_configs": [
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                ],
            }
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    command = [
        binary,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address={address}",
    ]
    with running(command, f"http://{address}", "/-/ready", "Prometheus") as proc:
        yield proc.url


def query(prometheus: str, promql: str) -> float | None:
    result = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}).json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def check_rules(folder: Path, name: str, queries: list[str]) -> subprocess.CompletedProcess:
    """`promtool check rules` on a rule file recording each query: Prometheus' own parser."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with Prometheus: apt-get install -y prometheus (the README's test command does)"
    rules = [{"record": f"argosy:q{i}", "expr": q} for i, q in enumerate(queries)]
    path = folder / f"{name}.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": name, "rules": rules}]}))
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
