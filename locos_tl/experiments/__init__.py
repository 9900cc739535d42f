"""The experiments: scoring, ablation, activation patching, KV-cache compression."""
