"""The model a served model runs, and its caches: an engine's TurboQuant cache, or the FP16
baseline (transformers' DynamicCache) of the same checkpoint. Placed like tq-run --device: on the
GPU in bfloat16 with the cache on the kernel library where it can run, else float32 on the CPU with
the Python reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..calibration.calibrate import REFERENCE_CONTEXT
from ..core.errors import TQError

CACHES = ("turboquant", "fp16")


@dataclass
class Runner:
    model: object
    tokenizer: object
    table: object  # the engine's KVTable (also sizes the FP16 baseline)
    cache_kind: str
    on_gpu: bool
    max_context: int
    eos: frozenset[int]

    @property
    def num_layers(self) -> int:
        return len(self.table.layers)

    @property
    def device(self):
        return self.model.device

    def new_cache(self):
        if self.cache_kind == "fp16":
            from transformers import DynamicCache

            return DynamicCache(config=self.model.config)
        from ..integrations.cache import TurboQuantCache

        return TurboQuantCache(self.table, backend="kernels" if self.on_gpu else "reference")

    def fp16_bytes_per_token(self) -> int:
        return cache_bytes(self.table, "fp16", 1)

    def bytes_for(self, tokens: int) -> int:
        """What a `tokens`-long sequence's cache holds, in the format's bytes."""
        return cache_bytes(self.table, self.cache_kind, tokens)

    def bytes_per_token(self) -> float:
        """At docs/FORMAT.md's reference context (sinks and the recent window amortized)."""
        return self.bytes_for(REFERENCE_CONTEXT) / REFERENCE_CONTEXT


def cache_bytes(table, cache_kind: str, tokens: int) -> int:
    """The bytes admission reserves for a `tokens`-long sequence in `cache_kind`: the engine's
    format (table.cache_bytes), or an FP16 cache of the same layers and KV heads."""
    if cache_kind == "fp16":
        return tokens * len(table.layers) * table.kv_heads * table.fp16_token_bytes()
    return table.cache_bytes(tokens)


def eos_ids(model) -> frozenset[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = model.config.eos_token_id
    return frozenset([eos] if isinstance(eos, int) else (eos or []))


def open_runner(engine_dir: str, cache_kind: str = "turboquant", device: str = "auto") -> Runner:
    """Load the engine's model (open_engine refuses tables made for another checkpoint)."""
    if cache_kind not in CACHES:
        raise TQError(f"cache {cache_kind!r} is unknown; use one of {', '.join(CACHES)}")
    from ..cli.common import place_model
    from ..engine import open_engine
    from .rows import use_rows_attention

    engine = open_engine(engine_dir)
    loaded = engine.loaded
    on_gpu = place_model(loaded.model, device)
    use_rows_attention(loaded.model)
    torch.set_grad_enabled(False)
    return Runner(loaded.model, loaded.tokenizer, engine.table, cache_kind, on_gpu,
                  loaded.max_context, eos_ids(loaded.model))
