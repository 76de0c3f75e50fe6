"""Model families, checkpoint loading and model fingerprints (what the calibration tables are tied to)."""
