"""Traces: Azure's public CSV format read as published, and the generators' rates and lengths."""

from __future__ import annotations

import itertools
import statistics

import pytest

from argosy.simulator.trace import TraceRequest, read_trace, write_trace
from argosy.simulator.workload import generate

# The first lines of Azure's LLM inference trace 2023 (AzureLLMInferenceTrace_conv.csv), as published.
AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2225410,879,55
2023-11-16 18:15:51.7893130,91,16
"""


def test_the_azure_format_is_read_as_published(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE)
    trace = read_trace(path)
    assert [(r.prompt_tokens, r.output_tokens) for r in trace] == [(374, 44), (396, 109), (879, 55), (91, 16)]
    assert [r.time for r in trace] == pytest.approx([0.0, 4.314579, 4.541951, 5.108723], abs=1e-6)


def test_a_written_trace_reads_back(tmp_path):
    requests = [TraceRequest(0.0, 10, 5), TraceRequest(1.5, 20, 0)]
    write_trace(tmp_path / "t.csv", requests)
    assert read_trace(tmp_path / "t.csv") == [TraceRequest(0.0, 10, 5), TraceRequest(1.5, 20, 1)]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("time,prompt\n1,2\n", "missing TIMESTAMP, ContextTokens, GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,x,2\n", "line 2"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,0,2\n", "ContextTokens must be at least 1"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
    ],
)
def test_a_bad_trace_is_refused_by_line_and_column(tmp_path, text, why):
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(ValueError, match=why):
        read_trace(tmp_path / "bad.csv")


def test_poisson_arrivals_come_at_their_rate_with_their_lengths():
    trace = generate("poisson:rate=4,duration=2000,prompt=300,output=50,seed=1")
    assert len(trace) == pytest.approx(8000, rel=0.05)
    gaps = [b.time - a.time for a, b in itertools.pairwise(trace)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.1)  # exponential: sd = mean
    assert statistics.mean(r.prompt_tokens for r in trace) == pytest.approx(300, rel=0.05)
    assert statistics.mean(r.output_tokens for r in trace) == pytest.approx(50, rel=0.05)


def test_phases_change_rate_at_their_boundaries():
    trace = generate("phases:rates=10/1/5,seconds=600,seed=2")
    counts = [sum(1 for r in trace if k * 600 <= r.time < (k + 1) * 600) for k in range(3)]
    assert counts == [pytest.approx(6000, rel=0.05), pytest.approx(600, rel=0.15), pytest.approx(3000, rel=0.05)]


def test_the_diurnal_rate_runs_from_low_to_high_and_back():
    trace = generate("diurnal:low=1,high=9,period=4000,duration=4000,seed=3")
    quarter = [sum(1 for r in trace if k * 1000 <= r.time < (k + 1) * 1000) for k in range(4)]
    # The mean rate over each quarter of a sine period: 5 -+ 8/pi.
    assert quarter[0] == pytest.approx(1000 * (5 - 8 / 3.14159), rel=0.1)
    assert quarter[1] == pytest.approx(1000 * (5 + 8 / 3.14159), rel=0.1)
    assert quarter[3] == pytest.approx(quarter[0], rel=0.15)


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("gamma:rate=1", "unknown workload 'gamma'"),
        ("poisson:rate=1", "needs duration="),
        ("poisson:rate=1,duration=5,colour=red", "unknown settings colour"),
        ("poisson:rate", "name=value"),
    ],
)
def test_a_bad_generator_is_refused_by_name(spec, why):
    with pytest.raises(ValueError, match=why):
        generate(spec)
