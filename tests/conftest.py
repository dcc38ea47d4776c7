from __future__ import annotations

import pytest

from tests.checkpoints import build_checkpoint

ARCHS = ("llama", "qwen2", "qwen3")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {arch: build_checkpoint(root / arch, arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def llama_checkpoint(checkpoints):
    return checkpoints["llama"]
