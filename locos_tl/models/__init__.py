"""Loading models: hub names, local and GGUF checkpoints, the real-model zoo, tokenizers."""
