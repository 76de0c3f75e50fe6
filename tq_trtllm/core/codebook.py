"""Lloyd-Max codebooks for one coordinate of a random unit vector (TurboQuant, Lemma 1).

For a uniformly random unit vector in dimension d, one coordinate y has density
f(y) ∝ (1 - y^2)^((d - 3) / 2) on [-1, 1]: (y + 1) / 2 is Beta((d - 1) / 2, (d - 1) / 2).
For large d that approaches N(0, 1/d). Both the CDF and the partial first moment have closed forms,
so Lloyd's iteration (centroid = conditional mean of its cell, boundary = midpoint) is exact up to
its convergence tolerance. Codebooks are returned in units of the unit vector's coordinates; the
Gaussian ones for N(0, 1) are those values times sqrt(d).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy import special

from .errors import TQError
from .spec import check_bits

KINDS = ("exact", "gaussian")


def _exact_moments(d: int):
    a = (d - 1) / 2.0
    log_c = special.gammaln(d / 2.0) - 0.5 * np.log(np.pi) - special.gammaln((d - 1) / 2.0)

    def cdf(y):
        return special.betainc(a, a, (np.clip(y, -1.0, 1.0) + 1.0) / 2.0)

    def partial_mean(y):
        # ∫_{-1}^{y} t f(t) dt = -C / (d - 1) * (1 - y^2)^((d - 1) / 2)
        y = np.clip(y, -1.0, 1.0)
        return -np.exp(log_c) / (d - 1) * np.power(1.0 - y * y, (d - 1) / 2.0)

    return cdf, partial_mean, 1.0


def _gaussian_moments(d: int):
    sigma = 1.0 / np.sqrt(d)

    def cdf(y):
        return special.ndtr(y / sigma)

    def partial_mean(y):
        # ∫_{-inf}^{y} t φσ(t) dt = -σ φ(y / σ)
        return -sigma * np.exp(-0.5 * (y / sigma) ** 2) / np.sqrt(2.0 * np.pi)

    return cdf, partial_mean, np.inf


@lru_cache(maxsize=None)
def lloyd_max(dim: int, bits: int, kind: str = "exact") -> np.ndarray:
    """Ascending float64 centroids (2**bits of them) for one coordinate of a unit vector in R^dim."""
    check_bits(bits)
    if kind not in KINDS:
        raise TQError(f"codebook kind {kind!r} is unknown; use one of {', '.join(KINDS)}")
    if dim < 2:
        raise TQError(f"codebook dimension {dim} must be at least 2")
    cdf, partial_mean, edge = (_exact_moments if kind == "exact" else _gaussian_moments)(dim)
    levels = 2**bits
    # Start from the Gaussian quantiles: close to the answer, so iteration converges fast.
    probs = (np.arange(levels) + 0.5) / levels
    centroids = special.ndtri(probs) / np.sqrt(dim)
    for _ in range(10_000):
        bounds = np.concatenate([[-edge], (centroids[1:] + centroids[:-1]) / 2.0, [edge]])
        mass = np.diff(cdf(bounds))
        updated = np.diff(partial_mean(bounds)) / mass
        if np.max(np.abs(updated - centroids)) < 1e-13:
            centroids = updated
            break
        centroids = updated
    centroids = (centroids - centroids[::-1]) / 2.0  # the density is symmetric: make it exactly so
    centroids.flags.writeable = False
    return centroids


def mse_per_coordinate(dim: int, bits: int, kind: str = "exact") -> float:
    """Expected squared error of one coordinate under its own density (for tests and reports)."""
    c = lloyd_max(dim, bits, kind)
    cdf, partial_mean, edge = (_exact_moments if kind == "exact" else _gaussian_moments)(dim)
    bounds = np.concatenate([[-edge], (c[1:] + c[:-1]) / 2.0, [edge]])
    mass = np.diff(cdf(bounds))
    # E[y^2] over the whole line is 1/d for both densities; E[(y - c)^2] = E[y^2] - sum mass * c^2
    # because each c is its cell's conditional mean.
    return float(1.0 / dim - np.sum(mass * c * c))


def on_grid(centroids) -> np.ndarray:
    """The levels every reader and writer uses (FORMAT.md section 1, "the 8-bit grid"): in float32,
    each moved to the nearest multiple of m / 127, m the largest magnitude. The CUDA kernels
    (layout.cpp) compute the same float64 expressions, so both sides hold identical levels, and a
    codebook already on its grid stays as it is."""
    c = np.asarray(centroids, dtype=np.float32).astype(np.float64)
    m = max(abs(c[0]), abs(c[-1]))
    levels = (np.rint(c * 127.0 / m) * m / 127.0).astype(np.float32).astype(np.float64)
    if not (levels[1:] > levels[:-1]).all():
        raise TQError("two codebook levels fall on the same step of the 8-bit grid (FORMAT.md "
                      "section 1): its levels are too close together")
    return levels
