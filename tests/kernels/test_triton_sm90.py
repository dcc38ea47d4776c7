"""The Triton kernels compiled ahead of time for Hopper (sm_90), with no GPU, in the
configurations the engine launches them in (bfloat16 and float32; head dims 64 to 256; block
sizes 16 and 32; MHA to GQA groups of 8): each fits a block's shared memory, none spills a
register (ptxas's own count), and every address into the KV cache is computed in 64
bits. What only a GPU can show (speed, and the kernels' results there) waits for bench/gpu.sh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels import sm90_configs

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton's NVIDIA backend compiles the kernels")


@pytest.fixture(scope="module")
def compiled() -> list[dict]:
    done = subprocess.run(
        # Run by its path: its own folder joins sys.path (for sm90_configs), never the repository root.
        [sys.executable, str(Path(__file__).with_name("sm90_compile.py"))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_every_kernel_and_configuration_compiles(compiled):
    names = {r["name"] for r in compiled}
    for kind in ("decode", "prefill"):
        for shape in sm90_configs.SHAPES:
            for block in sm90_configs.BLOCK_SIZES:
                for dtype in ("bfloat16", "float32"):
                    assert f"{kind}-{shape[0]}-block{block}-{dtype}" in names
    for family in ("decode-reduce", "write-kv", "copy-blocks", "rms-norm", "silu-and-mul", "rotary"):
        assert any(name.startswith(family + "-") for name in names), family


def test_each_fits_a_blocks_shared_memory(compiled):
    assert [r["name"] for r in compiled if r["shared"] > sm90_configs.SHARED_LIMIT] == []


def test_no_kernel_spills_a_register(compiled):
    """bfloat16 and float32 alike: the float32 tiles are smaller, chosen for this."""
    spilling = {r["name"]: r["spill_bytes"] for r in compiled if r["spill_bytes"]}
    assert spilling == {}


def test_every_address_into_the_kv_cache_is_computed_in_64_bits(compiled):
    narrow = {r["name"]: r["cache_offsets"] for r in compiled if set(r["cache_offsets"]) - {"i64"}}
    assert narrow == {}
    assert all(r["cache_offsets"] for r in compiled if r["name"].startswith(("decode-h", "prefill", "write-kv")))


def test_the_offset_check_sees_a_32_bit_offset():
    """The check itself can fail: a pointer from a cache argument moved by an i32 offset."""
    ttir = """
    %k = tt.splat %k_cache_ptr : !tt.ptr<bf16> -> tensor<64x!tt.ptr<bf16>> loc(#loc1)
    %k_2 = tt.addptr %k, %offs : tensor<64x!tt.ptr<bf16>>, tensor<64xi32> loc(#loc2)
    %q_3 = tt.addptr %q, %offs : tensor<64x!tt.ptr<bf16>>, tensor<64xi32> loc(#loc3)
    """
    assert sm90_configs.cache_offset_widths(ttir, ("k_cache_ptr",)) == ["i32"]
