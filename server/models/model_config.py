"""ModelConfig: what the engine needs to know about a checkpoint, read from its
config.json. The per-architecture differences of our one decoder live in `ARCHITECTURES`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from argosy.server.exceptions import CheckpointError, CheckpointNotFoundError, UnsupportedModelError
from argosy.server.regular_files import read_regular


@dataclass(frozen=True)
class ArchitectureTraits:
    qkv_bias: bool | None  # None: follow config.json's `attention_bias`
    qk_norm: bool  # RMSNorm over each head of q and k before rotary (Qwen3)


ARCHITECTURES: dict[str, ArchitectureTraits] = {
    "LlamaForCausalLM": ArchitectureTraits(qkv_bias=None, qk_norm=False),
    "MistralForCausalLM": ArchitectureTraits(qkv_bias=None, qk_norm=False),
    "Qwen2ForCausalLM": ArchitectureTraits(qkv_bias=True, qk_norm=False),
    "Qwen3ForCausalLM": ArchitectureTraits(qkv_bias=None, qk_norm=True),
}

ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    path: str
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    qkv_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    torch_dtype: str | None
    sliding_window: int | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelConfig:
        folder = Path(folder)
        raw = _read_json(folder / "config.json")
        arch = (raw.get("architectures") or [None])[0]
        if arch not in ARCHITECTURES:
            raise UnsupportedModelError(
                folder / "config.json",
                f"architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})",
            )
        traits = ARCHITECTURES[arch]
        if raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(folder / "config.json", f"hidden_act {raw['hidden_act']!r} is not supported")
        need = _Required(raw, folder / "config.json")
        num_heads = need("num_attention_heads")
        generation = _read_json(folder / "generation_config.json", required=False)
        return cls(
            path=str(folder),
            architecture=arch,
            hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or need("hidden_size") // num_heads,
            vocab_size=need("vocab_size"),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=_rope_config(raw, folder),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            qkv_bias=traits.qkv_bias if traits.qkv_bias is not None else bool(raw.get("attention_bias", False)),
            qk_norm=traits.qk_norm,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window", True) else None,
            eos_token_ids=tuple(
                dict.fromkeys(_token_ids(raw.get("eos_token_id")) + _token_ids(generation.get("eos_token_id")))
            ),
            bos_token_id=raw.get("bos_token_id"),
        )


class _Required:
    """Reads a key config.json must have, naming it when it is absent."""

    def __init__(self, raw: dict, path: Path):
        self.raw, self.path = raw, path

    def __call__(self, key: str):
        if key not in self.raw:
            raise CheckpointError(self.path, f"required key {key!r} is missing")
        return self.raw[key]


def _rope_config(raw: dict, folder: Path) -> RopeConfig:
    # transformers 5 writes `rope_parameters`; older checkpoints `rope_theta` + `rope_scaling`.
    params = dict(raw.get("rope_scaling") or {})
    params.update(raw.get("rope_parameters") or {})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(
            folder / "config.json", f"rope type {rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    return RopeConfig(
        theta=float(params.get("rope_theta", raw.get("rope_theta", 10000.0))),
        type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )


def _token_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, int) else tuple(value)


def _read_json(path: Path, required: bool = True) -> dict:
    if not path.exists():
        if required:
            raise CheckpointNotFoundError(path, "file not found")
        return {}
    try:
        return json.loads(read_regular(path))
    except OSError as exc:
        raise CheckpointError(path, f"unreadable ({exc.strerror or exc})") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"not valid JSON ({exc})") from exc
