#!/usr/bin/env bash
# Session 44's #58 runs, one after another on a quiet machine (llama.cpp built without AMX: benchmarks/README.md).
# The llama.cpp runs write every prompt's rows; the folder keeps their summaries (summary_*.json, results dropped).
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=benchmarks/results/bf16_target_s44_cpu
SETS=humaneval@20,gsm8k,benchmarks/prompts/chat20.jsonl
python3 benchmarks/cpu_kernels.py --dtypes float32,bfloat16,int8 --sizes 1,2,4,8,16,32,48,64 --reps 5 --threads 2 \
    --json $R/cost_qwen05b.json
python3 benchmarks/llamacpp.py --sets $SETS --limit 6 --max-new-tokens 128 --threads 2 \
    --strategies ar:dtype=float32,ar,cure,ddtree,ar:dtype=int8,cure:dtype=int8 --llama ar,lookup --quiet \
    --json $R/llamacpp18_qwen05b.json
python3 benchmarks/cpu_kernels.py --target qwen-coder-1.5b --dtypes float32,bfloat16,int8 --sizes 1,2,4,8,16,32,48,64 \
    --reps 5 --threads 2 --json $R/cost_qwen15b.json
python3 benchmarks/llamacpp.py --target qwen-coder-1.5b --sets $SETS --limit 6 --max-new-tokens 64 --threads 2 \
    --strategies ar:dtype=float32,ar,sd,cure,ddtree --llama ar,spec,lookup --quiet \
    --json $R/llamacpp18_qwen15b.json
# Quality (beside the test suite: tokens only, no timing):
#   cure bench humaneval --limit 40 -n 256 --strategies cure --dtype bfloat16 --allow-code-exec --threads 1 --json -o /tmp/he/bf16b
#   cure bench humaneval --limit 40 -n 256 --strategies cure --dtype float32 --allow-code-exec --threads 1 --json -o /tmp/he/f32b
#   python3 $R/compare_dtypes.py /tmp/he/bf16b /tmp/he/f32b      # he40/ keeps each run's results.json
