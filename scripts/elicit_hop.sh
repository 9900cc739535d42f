#!/usr/bin/env bash
# The hop elicitation of smollm2-135m-nolima (v2): LoRA rank 32 on the MLPs, hop_train
# entries on Dracula and the everyday prose, KL weight 1 to the frozen base, validation
# every 150 steps, early stop after 3 checks without a better score. Resumable: rerun
# the same command. Usage: scripts/elicit_hop.sh [OUT] (default runs/elicit/smollm2-hop)
set -euo pipefail
out="${1:-runs/elicit/smollm2-hop}"
exec locos elicit --base smollm2-135m-instruct --out "$out" --needle-set hop_train \
  --rank 32 --lr 2e-4 --steps 1200 --kl-weight 1 --val-every 150 --patience 3 --seed 0
