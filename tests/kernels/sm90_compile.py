"""Compiles the Triton kernels ahead of time for Hopper (sm_90), with no GPU, in the
configurations the engine launches them in, and reports what a GPU run would meet first: shared
memory, registers and spills (from ptxas), and whether the KV cache is addressed in 64 bits.

Run by test_triton_sm90.py as its own process (`python tests/kernels/sm90_compile.py`): Triton
must compile, not interpret, which the test session's interpreter excludes. Prints one JSON
line per compiled kernel; the configurations and the checks' constants are in sm90_configs.py,
which the test reads without importing Triton."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported: compile, never interpret
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch
import triton
from sm90_configs import BLOCK_SIZES, SHAPES, cache_offset_widths
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from argosy.kernels import (
    triton_attention_decode,
    triton_attention_prefill,
    triton_elementwise,
    triton_kv_cache,
)

TARGET = GPUTarget("cuda", 90, 32)
POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}


def compile_kernel(name: str, kernel, types: dict[str, str], constexprs: dict, cache_args: tuple[str, ...]) -> dict:
    """One kernel compiled for sm_90: `types` the runtime arguments' Triton types (pointers
    16-byte aligned, as PyTorch allocates them), `cache_args` the pointers to the KV cache."""
    options = {k: constexprs.pop(k) for k in ("num_warps", "num_stages") if k in constexprs}
    signature = {a: ("constexpr" if a in constexprs else types[a]) for a in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kernel.arg_names) if types.get(a, "")[:1] == "*"}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, aligned), target=TARGET, options=options)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as ptx:
        ptx.write(compiled.asm["ptx"])
    report = subprocess.run(
        [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", ptx.name, "-o", os.devnull],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    os.unlink(ptx.name)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    return {
        "name": name,
        "shared": compiled.metadata.shared,
        "registers": registers,
        "spill_bytes": sum(spills),
        "cache_offsets": cache_offset_widths(compiled.asm["ttir"], cache_args),
    }


def attention_jobs(dtype: torch.dtype):
    ptr = POINTER[dtype]
    for shape_name, heads, kv_heads, head_dim in SHAPES:
        for block_size in BLOCK_SIZES:
            tag = f"{shape_name}-block{block_size}-{str(dtype).removeprefix('torch.')}"
            common = {"scale": "fp32", **dict.fromkeys(["stride_q_tok", "stride_q_head", "stride_out_tok",
                      "stride_slot", "stride_kv_head", "stride_table"], "i32")}  # fmt: skip
            decode_types = {
                **common, **dict.fromkeys(["q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"], ptr),
                **dict.fromkeys(["block_tables_ptr", "seq_lens_ptr", "seqs_ptr", "tokens_ptr"], "*i64"),
                "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "num_splits": "i32",
            }  # fmt: skip
            constexprs = triton_attention_decode.split_constexprs(heads, kv_heads, head_dim, block_size, dtype)
            yield (f"decode-{tag}", triton_attention_decode._decode_split_kernel, decode_types,
                   constexprs, ("k_cache_ptr", "v_cache_ptr"))  # fmt: skip
            prefill_types = {
                **common, **dict.fromkeys(["q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"], ptr),
                **dict.fromkeys(["block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "seqs_ptr"], "*i64"),
            }  # fmt: skip
            constexprs = triton_attention_prefill.prefill_constexprs(heads, kv_heads, head_dim, block_size, dtype)
            yield (f"prefill-{tag}", triton_attention_prefill._prefill_kernel, prefill_types,
                   constexprs, ("k_cache_ptr", "v_cache_ptr"))  # fmt: skip
        reduce_types = {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": ptr, "tokens_ptr": "*i64",
                        "stride_out_tok": "i32", "num_splits": "i32"}  # fmt: skip
        yield (f"decode-reduce-{shape_name}-{str(dtype).removeprefix('torch.')}",
               triton_attention_decode._decode_reduce_kernel, reduce_types,
               triton_attention_decode.reduce_constexprs(head_dim), ())  # fmt: skip


def cache_and_elementwise_jobs():
    """The KV-cache writes and copies, and the norms, rotary and activation, for two shapes."""
    for shape_name, heads, kv_heads, head_dim in (SHAPES[0], SHAPES[3]):
        hidden, inter, ptr = heads * head_dim, 4 * heads * head_dim, "*bf16"
        row = kv_heads * head_dim
        yield (f"write-kv-{shape_name}", triton_kv_cache._write_kv_kernel,
               {**dict.fromkeys(["k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr"], ptr), "slot_mapping_ptr": "*i64",
                **dict.fromkeys(["stride_k_tok", "stride_v_tok", "stride_slot"], "i32")},
               triton_kv_cache.write_kv_constexprs(row), ("k_cache_ptr", "v_cache_ptr"))  # fmt: skip
        yield (f"copy-blocks-{shape_name}", triton_kv_cache._copy_blocks_kernel,
               {"cache_ptr": ptr, "src_ptr": "*i64", "dst_ptr": "*i64", "stride_plane": "i64"},
               triton_kv_cache.copy_constexprs(16 * row), ("cache_ptr",))  # fmt: skip
        yield (f"rms-norm-{shape_name}", triton_elementwise._rms_norm_kernel,
               {**dict.fromkeys(["x_ptr", "residual_ptr", "weight_ptr", "out_ptr", "residual_out_ptr"], ptr),
                "eps": "fp32",
                **dict.fromkeys(["stride_x_row", "stride_x_sub", "stride_r_row", "stride_r_sub"], "i32")},
               triton_elementwise.rms_norm_constexprs(hidden, has_residual=True), ())  # fmt: skip
        yield (f"silu-and-mul-{shape_name}", triton_elementwise._silu_and_mul_kernel,
               {"x_ptr": ptr, "out_ptr": ptr, "stride_x_row": "i32"},
               triton_elementwise.silu_and_mul_constexprs(inter), ())  # fmt: skip
        yield (f"rotary-{shape_name}", triton_elementwise._rotary_kernel,
               {"positions_ptr": "*i64", **dict.fromkeys(["q_ptr", "k_ptr", "q_out_ptr", "k_out_ptr"], ptr),
                "cos_ptr": "*fp32", "sin_ptr": "*fp32", "max_position": "i32",
                **dict.fromkeys(["stride_q_tok", "stride_q_head", "stride_k_tok", "stride_k_head", "stride_table"],
                                "i32")},
               triton_elementwise.rotary_constexprs(heads, kv_heads, head_dim), ())  # fmt: skip


def main(argv: list[str]) -> int:
    jobs = [*attention_jobs(torch.bfloat16), *attention_jobs(torch.float32), *cache_and_elementwise_jobs()]
    if argv:  # names to compile, for a quick look at some
        jobs = [job for job in jobs if any(word in job[0] for word in argv)]

    def run(job):
        name, kernel, types, constexprs, cache_args = job
        return compile_kernel(name, kernel, types, dict(constexprs), cache_args)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for result in pool.map(run, jobs):
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
