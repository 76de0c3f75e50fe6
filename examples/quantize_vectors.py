"""Quantize a few key vectors with the reference library, pack them into a page and read them back.

    .venv/bin/python examples/quantize_vectors.py

Seeded: every run prints the same figures.
"""

import torch

from tq_trtllm.core.packing import PageLayout, pack_page, read_tokens
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.spec import CodecSpec

spec = CodecSpec(head_dim=128, width=3)
codec = VectorCodec(spec, seed=42)
keys = torch.randn(16, 128, generator=torch.Generator().manual_seed(0))

encoded = codec.encode(keys)
layout = PageLayout(spec, tokens_per_block=16)
page = pack_page(encoded, layout)
decoded = codec.decode(read_tokens(page[None], layout, torch.zeros(16, dtype=torch.long), torch.arange(16)))

rel_mse = ((decoded - keys).norm(dim=-1) ** 2 / keys.norm(dim=-1) ** 2).mean().item()
print(f"{spec.bytes_per_token} bytes per token per head (fp16: {2 * spec.head_dim}); "
      f"page of 16 tokens: {layout.page_bytes} bytes; relative MSE {rel_mse:.4f}")
