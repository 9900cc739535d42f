#!/usr/bin/env bash
# The hop elicitation: LoRA rank 32 on the MLPs, hop_train entries on Dracula and the
# everyday prose, KL weight 1 to the frozen base, validation every 150 steps, early stop
# after 3 checks without a better score, book windows without BOS (the recipe of
# smollm2-135m-nolima and gemma3-270m-nolima-v1; `locos elicit` now puts BOS first by
# default, and gemma3-270m-nolima's recipe is scripts/elicit_hop_gemma.sh).
# Resumable: rerun the same command.
# Usage: scripts/elicit_hop.sh [OUT] [BASE]
#   (defaults: runs/elicit/smollm2-hop, smollm2-135m-instruct)
set -euo pipefail
out="${1:-runs/elicit/smollm2-hop}"
base="${2:-smollm2-135m-instruct}"
exec locos elicit --base "$base" --out "$out" --needle-set hop_train \
  --rank 32 --lr 2e-4 --steps 1200 --kl-weight 1 --val-every 150 --patience 3 --seed 0 \
  --no-text-bos
