"""What a calibration does and with how much data: CalibrationOptions and the recent window's bound.

Free of torch, so that the command-line tools can show these defaults in `--help` at once. Each
default cites the section of docs/QUALITY.md that measured it.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_RECENT_TOKENS = 64  # the recent window's bound (tables, tq-build)


@dataclass
class CalibrationOptions:
    key_mean: bool = True  # subtract the per-head key channel mean (restored exactly)
    key_scale: bool = True  # per-channel key scale from query/key statistics (folded into q)
    value_mean: bool = False
    value_scale: bool = False  # per-channel value scale from value statistics and o_proj weights
    sink_tokens: int = 0  # first tokens kept exact in fp16 (docs/QUALITY.md#sink-tokens)
    # each query's most recent positions read exact (table.recent_tokens): 16 took calibrated 3-bit
    # from +4.7% (own position only) to +1.4% perplexity at the same effective bits, 8 to +1.8%
    # (docs/QUALITY.md#own-position-and-recent-window)
    recent_tokens: int = 16
    per_layer: bool = True  # per-layer widths under the budget (else the same widths everywhere)
    window: int = 512  # calibration window length, tokens
    windows: int = 8  # windows for the statistics
    fisher_windows: int = 2  # windows of running text for the sensitivity
    # label samples per window for the Fisher estimate (one backward pass each): 2 allocate within
    # the spread of 4 samples' own estimate at 60% of the passes
    # (docs/QUALITY.md#calibration-cost-and-defaults)
    fisher_samples: int = 2
    # synthetic retrieval windows added to the Fisher windows (retrieval.py): 2 nearly doubled
    # passkey retrieval at 3 bits at unchanged perplexity
    # (docs/QUALITY.md#retrieval-windows-in-the-sensitivity)
    retrieval_windows: int = 2
    # subtract the measured log-mass inflation of the packed keys from the pages' log-sum-exp
    # (page_mass.py; docs/QUALITY.md#page-shift)
    page_shift: bool = True
    # channel pairs per KV head whose pre-RoPE key mean is subtracted as it turns (rotary_mean.py):
    # on SmolLM2-135M, 16 pairs take the keys' centred energy down by 41% at the calibration
    # positions and by 79% at positions 6,000-8,000 (docs/QUALITY.md#rotary-key-mean); 0: none
    rotary_pairs: int = 16
    # positions the key mean and outlier channels stand for (stats.py), and the key scale when
    # key_scale_lengths is empty: as the scale's context, 512 fitted the calibration windows' own
    # positions, 8,192 cost 3-bit passkey at 1,024 tokens, 2,048 at 8,000
    # (docs/QUALITY.md#statistics-context)
    stats_context: int = 2048
    # prompt lengths the key scale is balanced over (stats.py); None: powers of two from 1,024 to
    # the model's context; empty: fitted to stats_context alone, which at 2,048 lost 0.34 nats of
    # passkey at 8,000 tokens against the balanced scale
    # (docs/QUALITY.md#key-scale-balanced-over-lengths)
    key_scale_lengths: tuple[int, ...] | None = None
    seed: int = 0
