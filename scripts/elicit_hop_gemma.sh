#!/usr/bin/env bash
# The hop elicitation of gemma3-270m-nolima: the recipe of scripts/elicit_hop.sh with book
# windows that start with <bos> (how Gemma reads text), early-stopping perplexity on
# Mohicans part 2 (never trained on), and KL weight 0.3, chosen by the rule in
# docs/elicited.md among weights 1 and 0.3. Resumable: rerun the same command.
# Usage: scripts/elicit_hop_gemma.sh [OUT] [KL_WEIGHT]
#   (defaults: runs/elicit/gemma3-hop, 0.3); then, as shipped,
#   python -c "from locos_tl.models.elicited import cast_adapter; cast_adapter('OUT/adapter')"
set -euo pipefail
out="${1:-runs/elicit/gemma3-hop}"
weight="${2:-0.3}"
exec locos elicit --base gemma-3-270m --out "$out" --needle-set hop_train \
  --rank 32 --lr 2e-4 --steps 1200 --kl-weight "$weight" --val-every 150 --patience 3 \
  --seed 0 --text-bos --val-book mohicans_part2
