"""Per-layer K and V widths under an average-bit budget, from measured costs.

Greedy on marginal value: start every (layer, K/V) at the narrowest candidate width and repeatedly
take the upgrade that removes the most measured cost per added stored byte (codes and norms: at
head_dim 64 a fractional width's second norm makes it dearer than its code bits say), while the
average code width stays within the budget and the effective bits (every stored byte, counted by
the table) stay within the budget plus the allowed overhead.

More bits never make a codec worse in expectation, so measured costs are first made non-increasing
in the width (a rise is estimator noise); then every upgrade has a gain of zero or more and the
budget is used up.
"""

from __future__ import annotations

from collections.abc import Callable

EFFECTIVE_OVERHEAD = 0.3  # effective bits may exceed the named width by at most this much
# 5 bits serve the few layers whose keys carry far-back retrieval: allowed at the 4-bit budget they
# took most of the passkey loss away (docs/QUALITY.md#the-5-bit-width); 4.5 among the candidates
# gained nothing there, so it is left out.
CANDIDATE_WIDTHS = (2.0, 2.5, 3.0, 3.5, 4.0, 5.0)


def allocate_widths(costs: dict[tuple[int, int], dict[float, float]], budget: float,
                    size: Callable[[float], int],
                    effective_bits: Callable[[dict[tuple[int, int], float]], float]) -> dict:
    """costs[(layer, kind)][width] (kind 0 = K, 1 = V) -> {(layer, kind): width}.

    size(width): stored bytes per token and head; effective_bits(widths): bits per coordinate of
    a whole assignment.
    """
    costs = {slot: _non_increasing(options) for slot, options in costs.items()}
    widths = {slot: min(options) for slot, options in costs.items()}
    limit_code = budget * len(widths) + 1e-9
    limit_effective = budget + EFFECTIVE_OVERHEAD + 1e-9
    while True:
        used = sum(widths.values())
        best = None
        for slot, options in costs.items():
            current = widths[slot]
            for width, cost in options.items():
                if width <= current or used - current + width > limit_code:
                    continue
                gain = (options[current] - cost) / (size(width) - size(current))
                if best is None or gain > best[0]:
                    best = (gain, slot, width)
        if best is None:
            return widths
        _, slot, width = best
        trial = {**widths, slot: width}
        if effective_bits(trial) > limit_effective:
            del costs[slot][width]  # that upgrade does not fit; look for another
            continue
        widths = trial


def _non_increasing(options: dict[float, float]) -> dict[float, float]:
    out, lowest = {}, float("inf")
    for width in sorted(options):
        lowest = min(lowest, options[width])
        out[width] = lowest
    return out
