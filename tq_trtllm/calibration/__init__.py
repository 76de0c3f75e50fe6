"""Per-layer calibration: statistics of queries, keys and values, per-layer widths, saved tables.

  table       KVTable: what the cache needs per layer (widths, seed, means, scales, outliers)
  tables_io   saving and loading tables (safetensors + JSON header), with validation
  capture     an attention function that hands post-RoPE q, k, v to a callback
  stats       channel statistics per layer and KV head, and what they imply (mean, scale, outliers)
  sensitivity the Fisher estimate of each layer's loss increase at each width
  allocate    per-layer K and V widths under an average-bit budget
  calibrate   all of the above, from a model and a text
"""
