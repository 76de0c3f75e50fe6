"""Calibrating a model: statistics, sensitivity, widths, and the resulting table."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace

import torch
from tqdm import tqdm

from ..core.errors import TQError
from ..core.rotary_mean import RotaryMean, select_pairs
from ..core.spec import CodecSpec, parse_kv_bits
from ..models.checkpoint import LoadedModel
from ..models.fingerprint import fingerprint, head_dim_of
from ..models.registry import output_projections, rotary_frequencies
from .allocate import CANDIDATE_WIDTHS, allocate_widths
from .capture import run_observed, token_windows
from .options import CalibrationOptions
from .page_mass import measure_page_shifts
from .retrieval import retrieval_windows
from .sensitivity import fisher_gradients, fisher_terms
from .stats import ChannelStats, output_weights
from .table import KVTable, LayerTable

REFERENCE_CONTEXT = 1024  # the context length at which effective bits are budgeted


def balanced_lengths(max_context: int, shortest: int = 1024) -> tuple[int, ...]:
    """Powers of two from `shortest` up to the model's context, and the context itself."""
    lengths, n = [], shortest
    while n < max_context:
        lengths.append(n)
        n *= 2
    return (*lengths, max_context)


def collect_stats(model, windows: torch.Tensor, skip: int, context: int,
                  progress: bool = False) -> list[ChannelStats]:
    """Per layer, the statistics of the windows (positions from `skip` on), standing for positions
    0 .. context - 1."""
    cfg = model.config
    heads = cfg.num_key_value_heads
    head_dim = head_dim_of(cfg)
    inv_freq = rotary_frequencies(model)
    stats = [ChannelStats.zeros(heads, head_dim, inv_freq, context, output_weights(w, heads, head_dim))
             for w in output_projections(model)]

    def add(layer, query, key, value):
        stats[layer].add(query, key, value, skip)

    for row in tqdm(windows, desc="calibration statistics", disable=not progress):
        run_observed(model, row[None], add)
    return stats


def rotary_mean(stats: ChannelStats, pairs: int, skip: int) -> tuple[RotaryMean, ChannelStats]:
    """The rotary mean of the `pairs` pairs with the most pre-RoPE key mean energy, stated at packed
    position 0 (sequence position `skip`), and the statistics of the keys less it."""
    head_dim = stats.k_sum.shape[-1]
    rotary = select_pairs(stats.pre_rope_key_mean, stats.inv_freq, pairs, skip)
    return rotary, stats.less(rotary.vectors(torch.tensor(-skip), head_dim))


def _layer_table(stats: ChannelStats, key_scale: torch.Tensor | None, head_dim: int, key_width: float,
                 value_width: float, seed: int, opts: CalibrationOptions,
                 rotary: RotaryMean | None) -> LayerTable:
    n_k = CodecSpec(head_dim, key_width).num_outliers
    n_v = CodecSpec(head_dim, value_width).num_outliers
    f32 = torch.float32
    layer = LayerTable(
        key_width, value_width, seed,
        key_mean=stats.key_mean.to(f32) if opts.key_mean else None,
        key_scale=None if key_scale is None else key_scale.to(f32),
        key_outliers=stats.key_outliers(n_k, opts.key_mean) if n_k else None,
        value_mean=stats.value_mean.to(f32) if opts.value_mean else None,
        value_scale=stats.value_scale(opts.value_mean).to(f32) if opts.value_scale else None,
        value_outliers=stats.value_outliers(n_v, opts.value_mean, opts.value_scale) if n_v else None,
    )
    layer.key_rotary = rotary
    return layer


def calibrate(loaded: LoadedModel, text: str, kv_bits: str, opts: CalibrationOptions,
              source: str = "text", progress: bool = False) -> KVTable:
    """A table for `loaded` at `kv_bits`: a single width is an average budget shared out per layer
    (when opts.per_layer), a K/V pair such as k4v3 fixes the widths of every layer."""
    key_w, value_w = parse_kv_bits(kv_bits)
    cfg = loaded.config
    fp = fingerprint(loaded.family.name, cfg)
    head_dim, n_layers = fp["head_dim"], fp["layers"]
    windows = token_windows(loaded.tokenizer, text, opts.window, max(opts.windows, opts.fisher_windows))
    needed = opts.fisher_windows if opts.per_layer else 1
    if windows.shape[0] < needed:
        raise TQError(f"the calibration text has too few tokens: at least {needed * opts.window} are "
                      "needed; give a longer --calib-text")
    # positions beyond the model's limit never occur
    lengths = balanced_lengths(loaded.max_context) if opts.key_scale_lengths is None \
        else opts.key_scale_lengths
    opts = replace(opts, stats_context=min(opts.stats_context, loaded.max_context),
                   key_scale_lengths=tuple(sorted({min(n, loaded.max_context) for n in lengths})))
    stats = collect_stats(loaded.model, windows[: opts.windows], opts.sink_tokens, opts.stats_context,
                          progress)
    rotary = [None] * n_layers
    if opts.rotary_pairs:
        rotary, stats = zip(*(rotary_mean(s, opts.rotary_pairs, opts.sink_tokens) for s in stats))
    # the same in every candidate table, and the length-balanced one takes an iteration
    scales = [s.key_scale(opts.key_mean, opts.key_scale_lengths) if opts.key_scale else None
              for s in stats]

    def build(widths: dict) -> KVTable:
        layers = [_layer_table(stats[i], scales[i], head_dim, widths[(i, 0)], widths[(i, 1)],
                               opts.seed + i, opts, rotary[i]) for i in range(n_layers)]
        if opts.page_shift:  # measured once the widths are known; its bytes count from the start
            for layer in layers:
                layer.page_lse_shift = torch.zeros(fp["heads"])
        description = {"mode": "calibrated", "source": source,
                       "text_sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
                       "tokens": int(windows[: opts.windows].numel()), **asdict(opts)}
        return KVTable(fp, layers, opts.sink_tokens, str(kv_bits), description, opts.recent_tokens)

    uniform = {(i, k): w for i in range(n_layers) for k, w in ((0, key_w), (1, value_w))}
    if not opts.per_layer or key_w != value_w:
        table = build(uniform)
    else:
        fisher = windows[: opts.fisher_windows]
        if opts.retrieval_windows:
            fisher = torch.cat([fisher, retrieval_windows(loaded.tokenizer, text, opts.window,
                                                          opts.retrieval_windows, opts.seed)])
        costs = measure_costs(loaded.model, fisher, stats, scales, rotary, head_dim, opts, progress)
        widths = allocate_widths(costs, key_w, lambda w: CodecSpec(head_dim, w).bytes_per_token,
                                 lambda w: build(w).effective_bits(REFERENCE_CONTEXT))
        table = build(widths)
        table.calibration["fisher_costs"] = {
            f"{layer}.{'kv'[kind]}": {f"{w:g}": c for w, c in opt.items()}
            for (layer, kind), opt in costs.items()}
    if opts.page_shift:
        shifts = measure_page_shifts(loaded.model, windows[: opts.windows], table, progress)
        for layer, shift in zip(table.layers, shifts):
            layer.page_lse_shift = shift
    return table


def measure_costs(model, windows: torch.Tensor, stats: list[ChannelStats], key_scales: list,
                  rotary: list, head_dim: int, opts: CalibrationOptions, progress: bool,
                  terms: dict | None = None) -> dict:
    """Fisher cost of every (layer, K/V, candidate width), summed over the windows.

    Every window's gradients first (one forward and opts.fisher_samples backward passes each), then
    per layer and width one codec and one roundtrip over all windows at once; the layers are shared
    among threads, since each roundtrip's tensors are too small to keep the cores busy alone.
    terms: if given, filled with each (layer, kind, width)'s fisher_terms, [windows, samples]."""
    bar = tqdm(total=windows.shape[0] + len(stats), desc="layer sensitivity", disable=not progress)
    captured = []
    for row in windows:
        captured.append(fisher_gradients(model, row[None], opts.fisher_samples, opts.seed,
                                         opts.recent_tokens))
        bar.update()

    def layer_terms(layer: int) -> dict:
        k, v = (torch.cat([c[layer][i] for c in captured]) for i in (0, 1))
        grads_k, grads_v = ([torch.cat([c[layer][i][s] for c in captured])
                             for s in range(opts.fisher_samples)] for i in (2, 3))
        out = {}
        for width in CANDIDATE_WIDTHS:
            codecs = _layer_table(stats[layer], key_scales[layer], head_dim, width, width,
                                  opts.seed + layer, opts, rotary[layer]).codecs(head_dim)
            for kind, (x, grads) in enumerate(((k, grads_k), (v, grads_v))):
                out[(layer, kind, width)] = fisher_terms(x, grads, codecs[kind], opts.sink_tokens)
        bar.update()
        return out

    with ThreadPoolExecutor(max_workers=max(1, min(4, torch.get_num_threads()))) as pool:
        found = {key: t for part in pool.map(layer_terms, range(len(stats))) for key, t in part.items()}
    bar.close()
    if terms is not None:
        terms.update(found)
    costs: dict = {}
    for (layer, kind, width), t in sorted(found.items()):
        costs.setdefault((layer, kind), {})[width] = t.mean(dim=1).sum().item()
    return costs
