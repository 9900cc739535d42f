#!/usr/bin/env bash
# Targets of a hop elicitation (scripts/elicit_hop.sh) against its base, on the
# evaluation sets only: hop_eval (link kinds never trained on) and everyday. Greedy,
# chat template, Mohicans books, evaluation names; resumable (rerun the same command).
# Usage: scripts/evaluate_hop.sh [RUN] [PUBLISH]
set -euo pipefail
run="${1:-runs/elicit/smollm2-hop}"
pub="${2:-docs/real_models/smollm2-hop}"
base="$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['config']['base'])" \
        "$run/elicit.json")"
main="onehop:1000:1,direct:1000:1"
script=experiments/elicited_targets.py
# 1. the model, its base and (PREVIOUS=NAME, e.g. smollm2-135m-nolima-v1) an earlier
#    elicited model: 200 trials a main cell, every control, perplexity
python "$script" --models "$run,$base${PREVIOUS:+,$PREVIOUS}" --needle-set hop_eval --cells "$main" --n 200 \
  --n-control 95 --out runs/elicited_targets/hop_eval --publish "$pub/hop_eval"
# 2. the second evaluation set, the model and its base
python "$script" --models "$run,$base" --needle-set everyday --cells "$main" --n 200 \
  --no-general --out runs/elicited_targets/everyday --publish "$pub/everyday"
# 3. made-up links, 3 distractors and 2000 tokens (50 trials a cell), the model only
python "$script" --models "$run" --needle-set hop_eval --n-extra 50 --no-general \
  --cells "made_up:1000:1,onehop:1000:3,direct:1000:3,onehop:2000:1,direct:2000:1" \
  --out runs/elicited_targets/hop_eval_extra --publish "$pub/hop_eval_extra"
