"""The reference implementation of the packed KV cache: the oracle every kernel is tested against.

Modules, in the order a vector passes through them:
  spec       widths, groups and byte counts (docs/FORMAT.md sections 2 and 5)
  codebook   Lloyd-Max codebooks for the exact marginal and its Gaussian approximation
  rotation   randomized Hadamard and dense rotations
  quantizer  TurboQuant-MSE and TurboQuant-prod on tensors
  packing    bit planes and pages, byte for byte
  paged      a layer's paged pool (block tables, append, gather)
  attention  fp32 attention over a dequantized cache
"""
