"""Evaluations: quantizer distortion, and (with a model) perplexity and passkey retrieval."""
