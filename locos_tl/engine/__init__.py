"""The forward engine: LOCOS kernel, phi, HF twin, decoding, interventions, stop rules."""
