from __future__ import annotations

import pytest

from argosy.server.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(llama_checkpoint) -> Tokenizer:
    return Tokenizer(llama_checkpoint)
