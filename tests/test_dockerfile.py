"""The Dockerfile (no Docker engine here to build it): multi-stage, non-root with the uid the
pods run as, every source folder copied, `argosy` as the entry point."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from argosy.operator.deployment import RUN_AS_USER

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.+)$", DOCKERFILE, flags=re.MULTILINE)


def test_multi_stage_and_non_root():
    assert len(instructions("FROM")) >= 2
    assert instructions("USER")[-1] == f"{RUN_AS_USER}:{RUN_AS_USER}"
    chart_values = yaml.safe_load((ROOT / "charts" / "argosy" / "values.yaml").read_text())
    assert chart_values["podSecurityContext"]["runAsUser"] == RUN_AS_USER
    assert instructions("ENTRYPOINT") == ['["argosy"]']


def test_every_package_folder_is_copied_into_the_image():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"argosy", *config["package-dir"].values()}
    copied = {line.split()[0] for line in instructions("COPY") if not line.startswith("--from")}
    assert folders <= copied, folders - copied
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not folders & set(ignored)
