"""Rotations: the randomized Hadamard transform of the format, and a seeded dense one for comparison."""

from __future__ import annotations

import torch

from .errors import TQError

MASK32 = 0xFFFFFFFF


def mix32(seed: int, index: int) -> int:
    """The sign hash of docs/FORMAT.md section 4 (uint32 arithmetic)."""
    h = (seed * 0x9E3779B9 + index * 0x85EBCA6B + 0x27D4EB2F) & MASK32
    h ^= h >> 16
    h = (h * 0x7FEB352D) & MASK32
    h ^= h >> 15
    h = (h * 0x846CA68B) & MASK32
    h ^= h >> 16
    return h


def rotation_signs(seed: int, dim: int) -> torch.Tensor:
    """+1/-1 per coordinate, float32."""
    if not 0 <= seed <= MASK32:
        raise TQError(f"rotation seed {seed} must fit in 32 bits (0 to {MASK32})")
    return torch.tensor([-1.0 if mix32(seed, j) & 1 else 1.0 for j in range(dim)])


def check_hadamard_dim(n: int) -> None:
    if n < 16 or n > 256 or n & (n - 1):
        raise TQError(f"a Hadamard rotation needs a power-of-two size from 16 to 256, got {n}")


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal fast Walsh-Hadamard transform over the last dim (Sylvester order): H x / sqrt(n).

    Self-inverse, so it rotates and un-rotates.
    """
    n = x.shape[-1]
    check_hadamard_dim(n)
    lead = x.shape[:-1]
    y = x.reshape(-1, n)
    h = 1
    while h < n:
        y = y.view(-1, n // (2 * h), 2, h)
        y = torch.stack((y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]), dim=2)
        h *= 2
    return (y.reshape(*lead, n) / n**0.5).to(x.dtype)


def dense_rotation(seed: int, dim: int) -> torch.Tensor:
    """A Haar-random orthogonal matrix (QR of a seeded Gaussian, signs fixed), float64."""
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))
