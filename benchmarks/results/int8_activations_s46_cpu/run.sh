#!/usr/bin/env bash
# Session 46's runs, one after another on a quiet machine (a Xeon with AVX512-VNNI but neither AVX512-BF16 nor AMX;
# llama.cpp built natively: benchmarks/README.md). The llama.cpp runs write every prompt's rows to $W; the folder
# keeps their summaries (summary_*.json: `results` dropped) and the greedy agreement computed from the full files.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=benchmarks/results/int8_activations_s46_cpu
W=${W:-/tmp/cure_s46}
mkdir -p "$W"
SETS=humaneval@20,gsm8k,benchmarks/prompts/chat20.jsonl
# the cost of the second level, per forward, in alternation
python3 $R/step_cost.py --rounds 12 > $R/step_cost.json
# the 0.5B pair with two levels, with float32 ar for the agreement
python3 benchmarks/llamacpp.py --sets $SETS --limit 6 --max-new-tokens 128 --threads 2 \
    --strategies ar:dtype=float32,ar,cure,ddtree --llama ar,lookup --quiet --json $W/qwen05b_x2.json
# the same with one level: 8c46a55 (session 45's code), checked out in /tmp/old
PYTHONPATH=/tmp/old python3 /tmp/old/benchmarks/llamacpp.py --sets $SETS --limit 6 --max-new-tokens 128 --threads 2 \
    --strategies ar,cure,ddtree --llama ar --quiet --json $W/qwen05b_x1.json
# the final code (two levels; bfloat16 only where native, so the DFlash layers run float32 here), with the
# bfloat16 DFlash layers the code before ran here as a row
python3 benchmarks/llamacpp.py --sets $SETS --limit 6 --max-new-tokens 128 --threads 2 \
    --strategies ar,cure,cure:draft_dtype=bfloat16,ddtree --llama ar,lookup --quiet --json $W/qwen05b_final.json
python3 $R/agreement.py $W/qwen05b_x2.json $W/qwen05b_x1.json $W/qwen05b_final.json > $R/agreement.json
for f in qwen05b_x2 qwen05b_x1 qwen05b_final; do
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); r.pop("results"); json.dump(r, open(sys.argv[2], "w"), indent=1)' \
        $W/$f.json $R/summary_$f.json
done
# teacher-forced agreement, KL and hidden-state error, one level against two (no timing)
python3 $R/quality.py > $R/quality.txt
# tau at truly fixed budgets (no tuner: config_for's fix), one level against two, in one process (no timing)
python3 $R/fixed_budget_tau.py 8,16 > /tmp/fbt.log && sed -n '/^{$/,$p' /tmp/fbt.log > $R/fixed_budget_tau.json
