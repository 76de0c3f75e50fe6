"""TurboQuant on tensors: the MSE quantizer of docs/FORMAT.md and, for evaluation, TurboQuant-prod.

Everything runs in float64 so that the reference is exact up to the format's own rounding (the fp16
norm); any device and dtype goes in, the input's dtype comes out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .codebook import lloyd_max, on_grid
from .errors import TQError
from .rotary_mean import RotaryMean
from .rotation import dense_rotation, fwht, rotation_signs
from .spec import ROTATIONS, CodecSpec, check_head_dim

FP16_MAX = 65504.0
# What the per-group fp16 field stores (FORMAT.md step 4.5): "unbiased", the gain that keeps
# <x, x_hat> = ||x||^2 (what the cache writes), or "norm", ||x|| as in the paper's TurboQuant-MSE.
GAINS = ("unbiased", "norm")
# The scales that step 4.4 tries with the unbiased gain: alpha_k = (40 + k) / 50 in float32,
# k = 0..31, i.e. 0.80 to 1.42 (1.00 among them, so the search never does worse than plain rounding).
SEARCH_SCALES = torch.tensor([(40 + k) / 50 for k in range(32)], dtype=torch.float32).double()
# Rows of y searched at once: bounds the [rows, 32, n] temporaries to a few tens of MB.
_SEARCH_ROWS = 8192


def check_finite(what: str, *xs: torch.Tensor) -> None:
    """TQError unless every tensor is finite (on a GPU: one host sync for all of them)."""
    finite = torch.stack([torch.isfinite(x).all() for x in xs]).all()
    if not finite:
        raise TQError(
            f"{what} contains NaN or Inf; the KV cache cannot store non-finite activations "
            "(check the model's dtype and inputs)"
        )


@dataclass
class Encoded:
    """Codes and gains of a batch of vectors: codes[g] is [..., n_g] uint8; norms is [..., G] fp16,
    the format's per-group norm field, which holds the gain (FORMAT.md step 4.5)."""

    codes: list[torch.Tensor]
    norms: torch.Tensor


def outlier_permutation(head_dim: int, outliers) -> torch.Tensor:
    """perm = sorted(outliers) ++ sorted(the rest) (FORMAT.md section 1, step 2); int64 [head_dim]."""
    chosen = sorted(int(c) for c in outliers)
    if len(set(chosen)) != len(chosen) or any(not 0 <= c < head_dim for c in chosen):
        raise TQError(f"outlier channels must be distinct and in 0..{head_dim - 1}, got {chosen}")
    rest = [c for c in range(head_dim) if c not in set(chosen)]
    return torch.tensor(chosen + rest, dtype=torch.int64)


def nearest_codes(y: torch.Tensor, book: torch.Tensor) -> torch.Tensor:
    """Index of the nearest level: the number of decision boundaries strictly below y (ties go to
    the lower code)."""
    return torch.bucketize(y, (book[1:] + book[:-1]) / 2, right=False)


def search_candidates(y: torch.Tensor, book: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 4.4's candidates for rows y [rows, n]: the nearest codes of alpha * y for each alpha of
    SEARCH_SCALES, [rows, K, n], and their scores <y, c>^2 / ||c||^2 (0 where <y, c> <= 0), [rows, K]."""
    cand = nearest_codes(y[:, None, :] * SEARCH_SCALES.to(y.device)[:, None], book)
    c = book[cand]
    dot = (c * y[:, None, :]).sum(dim=-1)
    return cand, torch.where(dot > 0, dot * dot / (c * c).sum(dim=-1), 0.0)


def search_codes(y: torch.Tensor, book: torch.Tensor) -> torch.Tensor:
    """Step 4.4 with the unbiased gain: the candidate codes of the highest score (the first on ties).
    With the gain ||x|| / <y, c>, the error is ||x|| tan(angle(y, c)), so the best codes are those
    closest to y in angle, and rounding y itself is not always that (the levels are not scaled with y)."""
    rows = y.reshape(-1, y.shape[-1])
    out = []
    for part in rows.split(_SEARCH_ROWS):
        cand, score = search_candidates(part, book)
        best = score.argmax(dim=-1)  # the first maximum
        out.append(cand[torch.arange(len(part), device=y.device), best])
    return torch.cat(out).reshape(y.shape) if out else nearest_codes(y, book)


class VectorCodec:
    """TurboQuant-MSE for vectors of spec.head_dim channels (FORMAT.md section 1).

    mean, scale: [head_dim] or broadcastable to the inputs' [..., head_dim] (e.g. [kv_heads, head_dim]).
    outliers: channel indices of the wider group of a fractional width, [n_hi] or [kv_heads, n_hi];
    default: the first n_hi channels. codebooks: one per group, to replace the analytic ones.
    gain: one of GAINS. rotary: a RotaryMean subtracted at each vector's position before `mean`
    (keys only); encode and decode then need the vectors' packed positions.
    """

    def __init__(self, spec: CodecSpec, *, seed: int = 0, mean=None, scale=None, outliers=None,
                 codebooks=None, codebook_kind: str = "exact", rotation: str = "hadamard",
                 gain: str = "unbiased", rotary: RotaryMean | None = None):
        if rotation not in ROTATIONS:
            raise TQError(f"rotation {rotation!r} is unknown; use one of {', '.join(ROTATIONS)}")
        if gain not in GAINS:
            raise TQError(f"gain {gain!r} is unknown; use one of {', '.join(GAINS)}")
        self.gain = gain
        if rotation == "hadamard":
            check_head_dim(spec.head_dim)
        self.spec = spec
        self.seed = seed
        self.rotation = rotation
        d = spec.head_dim
        self.mean = None if mean is None else torch.as_tensor(mean, dtype=torch.float64)
        self.rotary = rotary
        self.scale = None if scale is None else torch.as_tensor(scale, dtype=torch.float64)
        for name, t in (("mean", self.mean), ("scale", self.scale)):
            if t is not None and t.shape[-1] != d:
                raise TQError(f"{name} has {t.shape[-1]} channels but head_dim is {d}")
        if self.scale is not None and not (self.scale > 0).all():
            raise TQError("every channel scale must be positive")
        self.perm = self._permutation(outliers)
        if codebooks is None:
            codebooks = [lloyd_max(g.dim, g.bits, codebook_kind) for g in spec.groups]
        for g, c in zip(spec.groups, codebooks):
            c = np.asarray(c, dtype=np.float64)
            if c.size != 2**g.bits or not np.isfinite(c).all() or not (c[1:] > c[:-1]).all():
                raise TQError(f"a {g.bits}-bit codebook needs {2**g.bits} finite ascending centroids")
        self.codebooks = [torch.tensor(on_grid(c), dtype=torch.float64) for c in codebooks]
        self.signs = rotation_signs(seed, d).to(torch.float64)
        self.dense = [dense_rotation(seed + i, g.dim) for i, g in enumerate(spec.groups)] \
            if rotation == "dense" else None

    def _permutation(self, outliers):
        n_hi = self.spec.num_outliers
        if outliers is None or n_hi == 0:
            if outliers is not None and len(outliers):
                raise TQError(f"width {self.spec.width:g} has one group: it takes no outlier channels")
            return None
        outliers = torch.as_tensor(outliers)
        if outliers.shape[-1] != n_hi:
            raise TQError(
                f"width {self.spec.width:g} at head_dim {self.spec.head_dim} splits "
                f"{n_hi} outlier channels from the rest, but {outliers.shape[-1]} were given"
            )
        rows = outliers.reshape(-1, n_hi)
        perms = torch.stack([outlier_permutation(self.spec.head_dim, r.tolist()) for r in rows])
        return perms.reshape(*outliers.shape[:-1], self.spec.head_dim)

    def per_head(self, name: str, heads: int) -> torch.Tensor | None:
        """mean, scale or perm broadcast to [heads, head_dim] (a view), or None when unset."""
        t = getattr(self, name)
        return None if t is None else t.expand(heads, self.spec.head_dim)

    # -- the per-group rotation (step 4.3) and its inverse --
    def _rotate(self, u: torch.Tensor, group: int, inverse: bool = False) -> torch.Tensor:
        if self.dense is None:
            return fwht(u)
        q = self.dense[group].to(u.device)
        return u @ q if inverse else u @ q.T

    def _rotary_vectors(self, positions, like: torch.Tensor) -> torch.Tensor | None:
        """R(p) m broadcastable to `like` [..., H, d], or None without a rotary mean."""
        if self.rotary is None:
            return None
        if positions is None:
            raise TQError("this codec has a rotary key mean: encoding and decoding need each "
                          "vector's packed position")
        positions = torch.as_tensor(positions, device=like.device)
        return self.rotary.vectors(positions, self.spec.head_dim)

    def _to_permuted(self, x: torch.Tensor, positions=None) -> torch.Tensor:
        """Steps 1-3: rotary mean, mean, scale, permutation and signs."""
        z = x.to(torch.float64)
        turned = self._rotary_vectors(positions, z)
        if turned is not None:
            z = z - turned
        if self.mean is not None:
            z = z - self.mean.to(z.device)
        if self.scale is not None:
            z = z / self.scale.to(z.device)
        if self.perm is not None:
            z = torch.take_along_dim(z, self.perm.to(z.device).expand_as(z), dim=-1)
        return z * self.signs.to(z.device)

    def _from_permuted(self, p: torch.Tensor, positions=None) -> torch.Tensor:
        z = p * self.signs.to(p.device)
        if self.perm is not None:
            out = torch.empty_like(z)
            z = out.scatter_(-1, self.perm.to(z.device).expand_as(z), z)
        if self.scale is not None:
            z = z * self.scale.to(z.device)
        if self.mean is not None:
            z = z + self.mean.to(z.device)
        turned = self._rotary_vectors(positions, z)
        return z if turned is None else z + turned

    def rotated(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per group, H s (x*scale)[perm] / sqrt(n): how a query is rotated (no mean, no norm)."""
        p = x.to(torch.float64)
        if self.scale is not None:
            p = p * self.scale.to(p.device)
        if self.perm is not None:
            p = torch.take_along_dim(p, self.perm.to(p.device).expand_as(p), dim=-1)
        p = p * self.signs.to(p.device)
        return [self._rotate(p[..., g.start:g.start + g.dim], i) for i, g in enumerate(self.spec.groups)]

    def normalized_rotated(self, x: torch.Tensor, positions=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Steps 1-4.3 per group: (norm_g [..., 1], y_g), y_g the rotated unit vector that step 4.4
        quantizes (0 where the group's norm is 0), float64."""
        p = self._to_permuted(x, positions)
        out = []
        for i, g in enumerate(self.spec.groups):
            part = p[..., g.start:g.start + g.dim]
            norm = part.norm(dim=-1, keepdim=True)
            u = torch.where(norm > 0, part / torch.where(norm > 0, norm, 1.0), 0.0)
            out.append((norm, self._rotate(u, i)))
        return out

    def encode(self, x: torch.Tensor, positions=None, search: bool = True) -> Encoded:
        """x [..., H, d] (or [..., d] without per-head tables); positions: the packed position of
        each vector, shaped like x's leading dims before H (needed with a rotary mean). search:
        step 4.4's scale search, as tq_quantize_append writes; False rounds y itself, as the
        one-token append fused into decode attention does (both valid encodings for any reader)."""
        if x.shape[-1] != self.spec.head_dim:
            raise TQError(f"vectors have {x.shape[-1]} channels but head_dim is {self.spec.head_dim}")
        check_finite("the key/value input", x)
        codes, gains = [], []
        for i, (norm, y) in enumerate(self.normalized_rotated(x, positions)):
            book = self.codebooks[i].to(y.device)
            code = search_codes(y, book) if search and self.gain == "unbiased" else nearest_codes(y, book)
            gain = norm
            if self.gain == "unbiased":  # undo the quantizer's shrinkage along x (step 4.5)
                dot = (y * book[code]).sum(dim=-1, keepdim=True)
                gain = torch.where(dot > 0, norm / torch.where(dot > 0, dot, 1.0), norm)
            if (gain > FP16_MAX).any():
                raise TQError(
                    f"a key/value vector has norm {norm.max().item():.4g}; its gain "
                    f"{gain.max().item():.4g} is beyond fp16's {FP16_MAX} and cannot be stored "
                    "(check the model's activations)"
                )
            codes.append(code.to(torch.uint8))
            gains.append(gain)
        return Encoded(codes, torch.cat(gains, dim=-1).to(torch.float16))

    def decode(self, enc: Encoded, dtype=torch.float32, positions=None) -> torch.Tensor:
        parts = []
        for i, g in enumerate(self.spec.groups):
            c = self.codebooks[i].to(enc.codes[i].device)[enc.codes[i].long()]
            parts.append(self._rotate(c, i, inverse=True) * enc.norms[..., i:i + 1].to(torch.float64))
        return self._from_permuted(torch.cat(parts, dim=-1), positions).to(dtype)

    def roundtrip(self, x: torch.Tensor, positions=None) -> torch.Tensor:
        return self.decode(self.encode(x, positions), dtype=x.dtype, positions=positions)


class ProdCodec:
    """TurboQuant-prod: a (b-1)-bit MSE codec plus a 1-bit QJL sketch of the residual (paper, Alg. 2).

    Reference only: unbiased inner products, higher variance; it has no packed form (FORMAT.md s. 7).
    """

    def __init__(self, head_dim: int, bits: int, *, seed: int = 0, rotation: str = "hadamard"):
        if not 2 <= bits <= 4:
            raise TQError(f"TurboQuant-prod needs 2 to 4 bits (one goes to QJL), got {bits}")
        self.mse = VectorCodec(CodecSpec(head_dim, bits - 1), seed=seed, rotation=rotation, gain="norm")
        gen = torch.Generator().manual_seed(seed + 0x51)
        self.sketch = torch.randn(head_dim, head_dim, generator=gen, dtype=torch.float64)

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        base = self.mse.decode(self.mse.encode(x), dtype=torch.float64)
        residual = x.to(torch.float64) - base
        s = self.sketch.to(x.device)
        signs = torch.sign(residual @ s.T)
        signs[signs == 0] = 1.0
        gamma = residual.norm(dim=-1, keepdim=True)
        d = x.shape[-1]
        return (base + math.sqrt(math.pi / 2) / d * gamma * (signs @ s)).to(x.dtype)
