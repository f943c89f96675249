#!/usr/bin/env bash
# Session 45's #58 runs, one after another on a quiet machine (the AMX Xeon; llama.cpp built without AMX:
# benchmarks/README.md). The runs write every prompt's rows and outputs to $W; the folder keeps their
# summaries (summary_*.json: `results` dropped) and the greedy agreement computed from the full files.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=benchmarks/results/llamacpp_s45_cpu
W=${W:-/tmp/cure_s45}
mkdir -p "$W"
SETS=humaneval@20,gsm8k,benchmarks/prompts/chat20.jsonl
# 1.5B pair, bfloat16 target (what --dtype auto picked before this session), run with 41fe6a3 + the argmax change
python3 benchmarks/llamacpp.py --target qwen-coder-1.5b --sets $SETS --limit 6 --max-new-tokens 64 --threads 2 \
    --strategies ar,sd,cure,ddtree --llama ar,spec,lookup --quiet --json $W/qwen15b_bf16.json
# 1.5B pair at the new defaults (--dtype auto = int8 here), with float32 ar
python3 benchmarks/llamacpp.py --target qwen-coder-1.5b --sets $SETS --limit 6 --max-new-tokens 64 --threads 2 \
    --strategies ar:dtype=float32,ar,sd,cure,ddtree --llama ar,spec,lookup --quiet --json $W/qwen15b_auto.json
# 0.5B pair at the new defaults, with float32 and bfloat16 rows
python3 benchmarks/llamacpp.py --sets $SETS --limit 6 --max-new-tokens 128 --threads 2 \
    --strategies ar:dtype=float32,ar:dtype=bfloat16,cure:dtype=bfloat16,ar,cure,ddtree --llama ar,lookup --quiet \
    --json $W/qwen05b_auto.json
# DFlash layers float32 against bfloat16 under the int8 target (the rule of 2916181), then the 0.5B pair on the final code
python3 benchmarks/peers.py --sets $SETS --limit 6 --max-new-tokens 128 --threads 2 --hf "" \
    --strategies ar,cure,cure:draft_dtype=bfloat16 --json $W/dflash_bf16_draft_qwen05b.json
python3 benchmarks/llamacpp.py --sets $SETS --limit 6 --max-new-tokens 128 --threads 2 \
    --strategies ar,cure,ddtree --llama ar,lookup --quiet --json $W/qwen05b_final.json
python3 $R/agreement.py $W/qwen05b_auto.json $W/qwen15b_auto.json > $R/agreement.json
for f in qwen15b_bf16 qwen15b_auto qwen05b_auto dflash_bf16_draft_qwen05b qwen05b_final; do
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); r.pop("results"); json.dump(r, open(sys.argv[2], "w"), indent=1)' \
        $W/$f.json $R/summary_$f.json
done
# Quality (tokens only, no timing): pass@1 of the int8 target on HumanEval 1-40, against session 44's runs
#   cure bench humaneval --limit 40 -n 256 --strategies cure --dtype int8 --allow-code-exec --threads 1 --json -o /tmp/he/int8
#   cp /tmp/he/int8/results.json $R/he40_int8_results.json
#   python3 $R/pass_at_1.py $R/he40_int8_results.json benchmarks/results/bf16_target_s44_cpu/he40/*_results.json
