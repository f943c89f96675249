#!/usr/bin/env bash
# The prepared runs for #13's GPU must-show, for a session that is lent a GPU (one H100/H200, 15 minutes of
# device time a task, at most 10 minutes a command). Random Qwen3-8B-shaped weights: no real weights reach
# that machine. Two parts, most important first, each one device call (the second right after the first,
# while the machine is warm); what they measure (benchmarks/gpu_costs.py, results in $OUT):
#   PART=1 (default, ~8 min: each compiled shape of the 8B compiles in ~35 s)
#     - the compiled verify curve (CUDA graphs) at V in COMPILE_SIZES, to hold against the HBM roofline, and
#       torch.profiler's top kernels of the compiled forward at V = 1 and 64 (where its time goes);
#     - e2e compiled: tokens/s, tau and per-block host overhead per strategy with the SYNTHETIC drafter
#       (synthetic_drafter.py: told the target's output, chain tau 6.5 at K=16), beside the random DFlash
#       drafter whose forwards it runs for their cost (compiled with the target), and per run the host's
#       waits for the device per block, by the line that waited (CUDA's sync debug mode: #13 item 4).
#   PART=2 (~4 min)
#     - lossless on CUDA: every strategy against ar on tiny float32 models (3 prompts, the compiled path too);
#     - e2e eager: the same strategies and more (V 64, the auto budget, the paper's tree), uncompiled.
# Stages that would start after DEADLINE seconds are skipped and recorded, and the JSON is rewritten after
# each stage, so a short lease still returns what was measured.
#
# Here, once (downloads what the device image lacks into .whl/, ignored by git; ~14 MB):
#     bash benchmarks/gpu_session.sh --prepare
# Then the device calls:
#     run(command="bash benchmarks/gpu_session.sh", carry=[".whl"], timeout_s=570)
#     run(command="PART=2 bash benchmarks/gpu_session.sh", carry=[".whl"], timeout_s=300)
# A CPU smoke run of both parts' steps (tiny models, no compile): SMOKE=1 bash benchmarks/gpu_session.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--prepare" ]]; then
    # The device image (KINDS.md) has torch 2.11, transformers 5.17, huggingface_hub 1.33, tokenizers 0.23.2,
    # typer, rich, numpy, safetensors, accelerate; it lacks platformdirs and the transformers minor we pin.
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    rm -rf .whl && mkdir -p .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .whl "transformers>=5.24,<5.25" "platformdirs>=4"
    ls -la .whl
    du -sh .whl
    exit 0
fi

OUT="${OUT:-$(mktemp -d)}"
PART="${PART:-1}"
DEADLINE="${DEADLINE:-$([[ "$PART" == 1 ]] && echo 420 || echo 200)}"
COMPILE_SIZES="${COMPILE_SIZES:-1,16,48,64}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [[ -n "${SMOKE:-}" ]]; then
    ARGS=(--shape tiny --device cpu --sizes 1,4,16 --reps 2 --lossless 2 --lossless-only cure-k8,ddtree-k8
          --stages e2e --e2e-modes eager --e2e-prompts 1 --e2e-tokens 48 --e2e-prompt-len 32)
    PART=smoke
else
    if [[ -d .whl ]]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
    fi
    nvidia-smi > "$OUT/nvidia_smi_part$PART.txt" 2>&1 || true
    COMMON=(--device cuda --shape qwen3-8b --stages e2e --e2e-prompts 3 --e2e-tokens 256 --e2e-prompt-len 512)
    if [[ "$PART" == 1 ]]; then
        ARGS=("${COMMON[@]}" --compile --compile-sizes "$COMPILE_SIZES" --profile-sizes 1,64 --e2e-modes compiled
              --e2e-runs ar,parallel,ddtree-v32,cure-v32)
    else
        ARGS=("${COMMON[@]}" --lossless 3 --lossless-only cure-k8,ddtree-k8,cure-compiled,cure-auto-budget
              --e2e-modes eager)
    fi
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
'cuda', torch.cuda.is_available())" | tee "$OUT/versions_part$PART.txt"
set -o pipefail
python3 benchmarks/gpu_costs.py "${ARGS[@]}" --deadline "$DEADLINE" --out "$OUT/gpu_session_part$PART.json" 2>&1 \
    | tee "$OUT/gpu_session_part$PART.log"
echo "results in $OUT"
