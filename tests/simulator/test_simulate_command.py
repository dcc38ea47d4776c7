"""`argosy simulate` as a user runs it: a trace or a generator, a profile, a service's YAML; the
table, summary.json and the plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from argosy.cli import main
from argosy.simulator.trace import TraceRequest, write_trace

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_KEYS = {
    "slo_attainment",
    "ttft_p50",
    "ttft_p99",
    "itl_p50",
    "itl_p99",
    "errors",
    "replica_seconds",
    "scale_events",
    "max_replicas",
}


@pytest.fixture
def profile_file(profile, tmp_path):
    path = tmp_path / "profile.json"
    profile.save(path)
    return path


def test_a_generated_burst_gives_the_table_the_summary_and_the_plots(profile_file, tmp_path, capsys):
    out = tmp_path / "run"
    trace = "phases:rates=1/12/1,seconds=120,prompt=300,output=60,seed=4"
    assert main(["simulate", "--trace", trace, "--profile", str(profile_file), "--output-dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_KEYS
    assert summary["max_replicas"] > 1 and summary["scale_events"] >= 2 and summary["errors"] == 0
    assert 0 < summary["slo_attainment"] <= 1 and summary["ttft_p50"] <= summary["ttft_p99"]
    for name in ("replicas", "queue", "latency"):
        data = (out / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    table = capsys.readouterr().out
    assert "slo_attainment" in table and "replica_seconds" in table


def test_a_trace_file_and_a_services_objectives(profile_file, tmp_path):
    trace = tmp_path / "trace.csv"
    write_trace(trace, [TraceRequest(i * 0.5, 200, 40) for i in range(200)])
    service = ROOT / "examples" / "inferenceservice-objectives.yaml"
    out = tmp_path / "run"
    args = ["simulate", "--trace", str(trace), "--profile", str(profile_file), "--output-dir", str(out)]
    assert main([*args, "--service", str(service), "--pod-start-seconds", "30"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 200 and summary["errors"] == 0
    # Started as a fleet of 5 that stood a while (minReplicas is 1): no pod start before the first requests.
    assert main([*args, "--service", str(service), "--initial-replicas", "5"]) == 0
    started = json.loads((out / "summary.json").read_text())
    assert started["max_replicas"] == 5 and started["ttft_p99"] < summary["ttft_p99"]
    assert main([*args, "--replicas", "2"]) == 0
    assert json.loads((out / "summary.json").read_text())["scale_events"] == 0


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--trace", "poisson:rate=1,duration=10", "--profile", "/nonexistent.json"], "write one with `argosy profile"),
        (["--trace", "poisson:rate=1"], "needs duration="),
        ([], "--trace is needed"),
    ],
)
def test_bad_input_is_refused_with_a_message(profile_file, tmp_path, capsys, args, why):
    if "--profile" not in args:
        args = [*args, "--profile", str(profile_file)]
    assert main(["simulate", *args, "--output-dir", str(tmp_path / "run")]) == 2
    assert why in capsys.readouterr().out
