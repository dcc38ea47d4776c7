"""The run's plots, as PNG: replicas over time, the queue over time, and TTFT over time against
its objective."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt

from argosy.simulator.summary import Objectives
from argosy.simulator.timeline import Timeline


def write_plots(timeline: Timeline, objectives: Objectives, folder: Path, title: str) -> list[Path]:
    minutes = [t / 60 for t in timeline.time]
    written = []

    def figure(name: str, ylabel: str, series: list[tuple[str, list[float]]], line: float | None = None):
        fig, ax = plt.subplots(figsize=(9, 3.5))
        for label, values in series:
            ax.plot(minutes, values, label=label, linewidth=1.2, drawstyle="steps-post")
        if line is not None:
            ax.axhline(line, color="red", linestyle="--", linewidth=1, label="objective")
        ax.set_xlabel("minutes")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    figure(
        "replicas",
        "replicas",
        [
            ("asked for", timeline.replicas),
            ("ready", timeline.ready),
            ("starting", timeline.starting),
            ("asleep", timeline.asleep),
        ],
    )
    figure("queue", "requests", [("waiting", timeline.waiting), ("running", timeline.running)])
    figure(
        "latency",
        "TTFT (s)",
        [("p50", timeline.ttft_p50), ("p99", timeline.ttft_p99)],
        objectives.ttft_seconds,
    )
    return written
