"""The GPU path, measured: the Triton decode-attention kernel's bandwidth against the card's
own copy bandwidth, and the decode step of a Llama-3-8B-shaped model (random weights) eager
vs CUDA graphs, in bfloat16 and with FP8 weights. All ratios come from one run.

    python bench/gpu_kernels.py            # on a GPU
    python bench/gpu_kernels.py --dry-run  # on CPU: every path once at toy shapes (interpreted
                                       # kernels, the graphs' eager twin); the numbers mean nothing
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import torch

from argosy.kernels.attention_backend import select_backend
from argosy.kernels.triton_attention_decode import decode_attention, num_splits_for
from argosy.kernels.triton_backend import TritonAttention
from argosy.server.models.decoder import CausalLM
from argosy.server.models.fp8 import linear_weight_bytes
from argosy.server.models.linear import process_weights
from argosy.server.models.linear_factory import LinearFactory
from argosy.server.models.model_config import ModelConfig, RopeConfig
from argosy.server.worker.block_tables import BlockTables
from argosy.server.worker.cuda_graphs import DecodeGraphs
from argosy.server.worker.step_inputs import SequenceChunk, prepare_inputs

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128)
TOY = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
BLOCK_SIZE = 16
HEADS, KV_HEADS, HEAD_DIM = (LLAMA3_8B[k] for k in ("num_heads", "num_kv_heads", "head_dim"))


def timed(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Seconds per call, after a warm-up call."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / iters


def copy_bandwidth(device: torch.device, nbytes: int, iters: int) -> float:
    """Bytes read + written per second by a device-to-device copy."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / timed(lambda: dst.copy_(src), device, iters)


def attention_rows(device, batches, contexts, dtype, iters, copy_bw) -> None:
    print(f"\ndecode attention, {HEADS} query / {KV_HEADS} KV heads, head_dim {HEAD_DIM}, {dtype}, block {BLOCK_SIZE}")
    print("| batch | context | splits | us | GB/s | of copy bandwidth |\n|--:|--:|--:|--:|--:|--:|")
    target_programs = TritonAttention(device, KV_HEADS).target_programs  # the engine's split counts
    for batch in batches:
        for context in contexts:
            splits = num_splits_for(batch, KV_HEADS, context, target_programs)
            seconds, moved = time_decode_attention(device, dtype, batch, context, splits, iters)
            bw = moved / seconds
            print(f"| {batch} | {context} | {splits} | {seconds * 1e6:.0f} | {bw / 1e9:.0f} | {bw / copy_bw:.0%} |")


def time_decode_attention(device, dtype, batch: int, context: int, splits: int, iters: int) -> tuple[float, int]:
    """Seconds per call, and the bytes one call must move: all K and V, the queries, the output."""
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq)  # scattered blocks
    seq_lens = torch.full((batch,), context, device=device)
    q = torch.randn(batch, HEADS, HEAD_DIM, dtype=dtype, device=device)
    out = torch.empty(batch, HEADS * HEAD_DIM, dtype=dtype, device=device)
    rows = torch.arange(batch, device=device)
    scale = HEAD_DIM**-0.5
    seconds = timed(
        lambda: decode_attention(q, k_cache, v_cache, tables, seq_lens, rows, rows, out, scale, splits), device, iters
    )
    return seconds, 2 * k_cache.numel() * k_cache.element_size() + 2 * q.numel() * q.element_size()


def random_model(
    shape: dict, dtype: torch.dtype, device: torch.device, backend, max_len: int, linears: LinearFactory
) -> CausalLM:
    cfg = ModelConfig(
        path="random", architecture="LlamaForCausalLM", vocab_size=128256 if shape is LLAMA3_8B else 320,
        rms_norm_eps=1e-5, rope=RopeConfig(500000.0, "llama3", 8.0, 1.0, 4.0, 8192), max_position_embeddings=max_len,
        qkv_bias=False, qk_norm=False, tie_word_embeddings=False, torch_dtype="bfloat16", sliding_window=None,
        eos_token_ids=(), bos_token_id=None, **shape,
    )  # fmt: skip
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = CausalLM(cfg, max_len, backend, linears).eval()
        process_weights(model)
        return model
    finally:
        torch.set_default_dtype(previous)


def step_rows(shape, device, dtype, batches, context, iters, backend_name) -> None:
    max_len = context + 64
    backend = select_backend(backend_name, device, shape["num_kv_heads"])
    model = random_model(shape, dtype, device, backend, max_len, LinearFactory())
    cfg = model.config
    blocks_per_seq = -(-max_len // BLOCK_SIZE)
    num_blocks = max(batches) * blocks_per_seq
    kv_cache = torch.zeros(
        cfg.num_layers, 2, num_blocks + 1, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=device
    )
    print(f"\ndecode step, {shape}, context {context}, {dtype}, backend {backend.name}, {device}")
    print(
        "| weights | linear weight GiB | batch | eager ms | graphs ms | graphs speed-up | max abs logit diff |\n"
        "|---|--:|--:|--:|--:|--:|--:|"
    )
    for weights in (str(dtype).removeprefix("torch."), "fp8"):
        if weights == "fp8":
            model = None  # the unquantized weights go before the quantized model is made
            model = random_model(shape, dtype, device, backend, max_len, LinearFactory(quantization="fp8"))
            fp8_error = fp8_product_error(model.layers[0].mlp.gate_up_proj, cfg.hidden_size, device, dtype)
        graphs = DecodeGraphs(model, backend, [(b, 1) for b in batches], blocks_per_seq, BLOCK_SIZE, max_len, device)
        graphs.capture(kv_cache, num_blocks)
        gib = linear_weight_bytes(model) / (1 << 30)
        for batch in batches:
            rng = random.Random(batch)
            tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch)]
            chunks = [
                SequenceChunk([rng.randrange(cfg.vocab_size)], context, table, True, row)
                for row, table in enumerate(tables)
            ]
            block_tables = BlockTables.of(tables, device)
            eager, graphed, diff = time_step(model, backend, graphs, kv_cache, chunks, block_tables, device, iters)
            ms = f"{eager * 1e3:.2f} | {graphed * 1e3:.2f}"
            print(f"| {weights} | {gib:.2f} | {batch} | {ms} | {eager / graphed:.2f}x | {diff:.3g} |")
        graphs = None  # its memory pool goes before the next capture
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(
        f"\nfp8 product ({'FP8 GEMM' if model.layers[0].mlp.gate_up_proj.use_fp8_gemm else 'dequantized'}): "
        f"relative error {fp8_error:.4f} against the dequantized weight's product (e4m3: about 2^-4 or less)"
    )


def fp8_product_error(layer, width: int, device, dtype) -> float:
    """The quantized layer's product against the same weight dequantized, on random activations:
    checks the FP8 GEMM path (its per-token activation scales) where it runs."""
    x = torch.randn(64, width, device=device, dtype=dtype)
    with torch.inference_mode():
        ours = layer(x).float()
        exact = torch.nn.functional.linear(x, layer.dequantized_weight(dtype)).float()
    return float((ours - exact).norm() / exact.norm())


@torch.inference_mode()
def time_step(model, backend, graphs, kv_cache, chunks, tables, device, iters) -> tuple[float, float, float]:
    """Seconds per decode step, eager and through the graphs, host-side input building included,
    and how far apart their logits are: rounding only (a graph may split long contexts
    differently, as it is sized for max_model_len)."""

    def eager():
        inputs = prepare_inputs(chunks, BLOCK_SIZE, device, backend, tables)
        return model.compute_logits(model(inputs.input_ids, inputs.positions, kv_cache, inputs.attention))

    def graphed():
        return model.compute_logits(graphs.run(chunks, tables))

    diff = float((eager() - graphed()).abs().max())
    return timed(eager, device, iters), timed(graphed, device, iters), diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="toy shapes on CPU: checks every path runs")
    args = parser.parse_args()
    if args.dry_run:
        device, dtype, iters = torch.device("cpu"), torch.float32, 1
        copy_bw = copy_bandwidth(device, 1 << 20, iters)
        attention_rows(device, [1, 3], [40], dtype, iters, copy_bw)
        step_rows(TOY, device, dtype, [1, 2], 40, iters, "torch")
        return
    device, dtype, iters = torch.device("cuda"), torch.bfloat16, 20
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    copy_bw = copy_bandwidth(device, 1 << 30, iters)
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (bytes read + written)")
    attention_rows(device, [1, 8, 64, 256], [512, 4096], dtype, iters, copy_bw)
    step_rows(LLAMA3_8B, device, dtype, [1, 8, 64], 1024, iters, "triton")


if __name__ == "__main__":
    main()
