"""Generate with transformers over an engine's 3-bit KV cache (the Python reference on CPU, the
kernel library on a GPU): what `tq-run` does, in a few lines of your own code.

    .venv/bin/tq-build --model llama --kv-bits 3        # writes engines/llama-kv3
    .venv/bin/python examples/generate_with_cache.py [ENGINE_DIR] [PROMPT]

Greedy decoding, so every run prints the same text.
"""

import sys

import torch

from tq_trtllm.engine import open_engine
from tq_trtllm.integrations.attention import use_turboquant_attention
from tq_trtllm.integrations.cache import TurboQuantCache

engine = open_engine(sys.argv[1] if len(sys.argv) > 1 else "engines/llama-kv3")
model, tokenizer = engine.loaded.model, engine.loaded.tokenizer
use_turboquant_attention(model)  # the model's attention reads the packed cache in place
prompt = sys.argv[2] if len(sys.argv) > 2 else "The three primary colors are"
ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
cache = TurboQuantCache(engine.table)
with torch.inference_mode():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                         max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.eos_token_id)
print(prompt + tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
print(f"KV cache: {cache.stored_bytes():,} bytes; FP16 would hold {cache.fp16_bytes():,}")
