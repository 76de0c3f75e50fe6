"""Model families, checkpoint loading and model fingerprints (what the calibration tables are tied to),
and the attention function a transformers model calls (attention: observers, caches' tagged keys)."""
