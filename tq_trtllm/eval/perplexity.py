"""Perplexity and top-1 agreement of quantized caches against an fp16 cache, on the same windows.

Each window is one forward pass through a fresh cache, so every position's keys and values are read
back from the quantized cache: the caches read a step's own tokens through the cache too
(chunk_reads "cache"), as a decode step would, which is the protocol of every figure in
docs/QUALITY.md. (The runtime's default, "exact", reads a prompt's own tokens as computed: one
window would then measure nothing but the fp16 rounding.) The comparison is paired: per window,
the difference of mean negative log-likelihoods; its mean and a t-interval give the perplexity
ratio and its 95% CI.
"""

from __future__ import annotations

import math

import torch
from tqdm import tqdm

from ..calibration.table import KVTable
from ..core.errors import TQError
from ..integrations.attention import use_turboquant_attention
from ..integrations.cache import TurboQuantCache
from ..models.fingerprint import head_dim_of
from .baselines import RoundtripCache, baseline_effective_bits
from .paired import mean_ci95

MIN_WINDOWS = 2
CHUNK_READS = "cache"  # see above


def _forward(model, ids: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean NLL of next-token prediction, argmax predictions [T-1]) for one window [T]."""
    ids = ids.to(model.device)
    logits = model(input_ids=ids[None], past_key_values=cache, use_cache=True).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[1:])
    return nll, logits.argmax(dim=-1)


def compare_caches(model, windows: torch.Tensor, methods: dict, progress: bool = False) -> dict:
    """methods: name -> (zero-argument cache factory, effective bits). Returns name -> metrics."""
    if windows.shape[0] < MIN_WINDOWS:
        raise TQError(f"the corpus gives {windows.shape[0]} windows; at least {MIN_WINDOWS} are needed "
                      "for a confidence interval (use a longer corpus or a shorter --window)")
    cfg = model.config
    use_turboquant_attention(model)
    base_nll, nll, agree = [], {m: [] for m in methods}, {m: [] for m in methods}
    head_dim = head_dim_of(cfg)
    with torch.inference_mode():
        for ids in tqdm(windows, desc="perplexity windows", disable=not progress):
            ref_nll, ref_top = _forward(model, ids, RoundtripCache("fp16", cfg.num_hidden_layers, head_dim,
                                                                   CHUNK_READS))
            base_nll.append(ref_nll.item())
            for name, (factory, _) in methods.items():
                n, top = _forward(model, ids, factory())
                nll[name].append(n.item())
                agree[name].append((top == ref_top).float().mean().item())
    base = torch.tensor(base_nll, dtype=torch.float64)
    return {name: _summary(base, torch.tensor(nll[name], dtype=torch.float64), agree[name], bits,
                           windows.shape)
            for name, (_, bits) in methods.items()}


def _summary(base: torch.Tensor, quant: torch.Tensor, agree: list, bits: float, shape) -> dict:
    deltas = (quant - base).tolist()
    mean, low, high = mean_ci95(deltas)
    return {
        "ppl_fp16": math.exp(base.mean().item()),
        "ppl_kv": math.exp(quant.mean().item()),
        "delta_pct": 100 * (math.exp(mean) - 1),
        "delta_ci95_pct": [100 * (math.exp(low) - 1), 100 * (math.exp(high) - 1)],
        "top1_agreement": sum(agree) / len(agree),
        "effective_bits": bits,
        "windows": int(shape[0]),
        "window_tokens": int(shape[1]),
        # per window, so that runs on the same windows pair up (one engine against another)
        "window_delta_nats": deltas,
    }


def engine_method(table: KVTable, window: int, backend: str = "auto"):
    return (lambda: TurboQuantCache(table, backend=backend, chunk_reads=CHUNK_READS)), \
        table.effective_bits(window)


def baseline_method(name: str, model, window: int):
    cfg = model.config
    head_dim = head_dim_of(cfg)
    return (lambda: RoundtripCache(name, cfg.num_hidden_layers, head_dim, CHUNK_READS)), \
        baseline_effective_bits(name, head_dim)
