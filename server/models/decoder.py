"""One decoder-only transformer for Llama, Mistral, Qwen2 and Qwen3. The architectures
differ only in the flags of ModelConfig: q/k/v bias (Qwen2) and per-head q/k RMSNorm (Qwen3).
Attention, the KV-cache writes, the norms, rotary and the activation come from its attention
backend (the residual add is fused into the next norm); the linear layers come from a
LinearFactory, in the weight format it picks. With tensor parallelism the model is built from
one rank's share of the heads, the MLP and the vocabulary: `all_reduce` sums the partial
outputs of the attention's and the MLP's last projections across the ranks, and `vocab` makes
the embeddings and the logits whole (server/parallel/vocab.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from argosy.kernels.attention_interface import AttentionBackend
from argosy.server.models.layers import GatedMLP, RMSNorm, RotaryEmbedding
from argosy.server.models.linear_factory import PLAIN, LinearFactory
from argosy.server.models.model_config import ModelConfig
from argosy.server.models.tensor_reader import ReadStats
from argosy.server.parallel.pipeline import Carried
from argosy.server.parallel.stages import PipelineStage
from argosy.server.parallel.vocab import VocabShard

Reduce = Callable[[torch.Tensor], torch.Tensor] | None  # sums a partial output across ranks; None: one rank
# (x, residual, positions, kv_cache, meta) -> (x, residual): every layer at once (one_call_layers.py).
Pair = tuple[torch.Tensor, torch.Tensor]
LayersCall = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, Any], Pair]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, linears: LinearFactory, all_reduce: Reduce = None):
        super().__init__()
        self.backend = backend
        self.all_reduce = all_reduce
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = linears("qkv_proj", cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = linears("o_proj", self.q_size, cfg.hidden_size)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, backend.kernels) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, backend.kernels) if cfg.qk_norm else None

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding, kv_cache: torch.Tensor, meta: Any
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split_with_sizes([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(positions, q, k)
        out = self.o_proj(self.backend.forward(q, k, v, kv_cache, meta, self.scale))
        return out if self.all_reduce is None else self.all_reduce(out)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, linears: LinearFactory, all_reduce: Reduce = None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, backend.kernels)
        self.self_attn = Attention(cfg, backend, linears, all_reduce)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, backend.kernels)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, backend.kernels, linears, all_reduce)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        kv_cache: torch.Tensor,
        meta: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the layer's output and the residual stream it has not yet been added to."""
        h, residual = (self.input_layernorm(x), x) if residual is None else self.input_layernorm(x, residual)
        h = self.self_attn(h, positions, rotary, kv_cache, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class CausalLM(nn.Module):
    """Token ids of a flattened batch in, final hidden states out; logits on request.

    With pipeline parallelism, one stage of it (server/parallel/stages.py): its decoder layers only
    (numbered from 0 here), the embedding on the first stage and the final norm and the LM head on
    the last (with tied embeddings the last stage holds the embedding too, as its head)."""

    def __init__(
        self,
        cfg: ModelConfig,
        max_position: int,
        backend: AttentionBackend,
        linears: LinearFactory = PLAIN,
        all_reduce: Reduce = None,
        vocab: VocabShard | None = None,
        stage: PipelineStage | None = None,
    ):
        super().__init__()
        self.config, self.vocab, self.stage = cfg, vocab, stage
        first, last = stage is None or stage.first, stage is None or stage.last
        self.checkpoint_read = ReadStats()  # what loading it read from the checkpoint
        held = first or (last and cfg.tie_word_embeddings)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if held else None
        layers = cfg.num_layers if stage is None else stage.num_layers
        self.layers = nn.ModuleList(DecoderLayer(cfg, backend, linears, all_reduce) for _ in range(layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, backend.kernels) if last else None
        self.lm_head = (
            None if cfg.tie_word_embeddings or not last else linears("lm_head", cfg.hidden_size, cfg.vocab_size)
        )
        self.rotary = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope, backend.kernels)
        # Set by the model runner where the layers run in one C++ call (CPU); the modules otherwise.
        self.one_call: LayersCall | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: Any,
        carried: Carried | None = None,
    ) -> torch.Tensor | Carried:
        """kv_cache: [layers, 2, blocks, block_size, kv_heads, head_dim]. A pipeline stage after the
        first starts from the previous stage's `carried` activations; a stage before the last
        returns its own (hidden states, residual stream) for the next."""
        if carried is None:
            x = self.embed_tokens(input_ids) if self.vocab is None else self.vocab.embed(self.embed_tokens, input_ids)
            residual = None
        else:
            x, residual = carried
        if self.one_call is not None:
            x, residual = self.one_call(x, residual, positions, kv_cache, meta)
        else:
            for layer, layer_cache in zip(self.layers, kv_cache):
                x, residual = layer(x, residual, positions, self.rotary, layer_cache, meta)
        if self.norm is None:
            return x, residual
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:  # tied to the embeddings
            logits = nn.functional.linear(hidden, self.embed_tokens.weight)
        else:
            logits = self.lm_head(hidden)
        return logits if self.vocab is None else self.vocab.logits(logits)
