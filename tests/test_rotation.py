"""Rotations: the Hadamard transform is orthonormal and self-inverse; signs follow FORMAT.md s. 4."""

import numpy as np
import pytest
import scipy.linalg
import torch

from tq_trtllm.core.errors import TQError
from tq_trtllm.core.rotation import dense_rotation, fwht, mix32, rotation_signs


def mix32_numpy(seed, j):
    """FORMAT.md section 4 written again with numpy's wrapping uint32 arithmetic."""
    with np.errstate(over="ignore"):
        h = np.uint32(seed) * np.uint32(0x9E3779B9) + np.uint32(j) * np.uint32(0x85EBCA6B) \
            + np.uint32(0x27D4EB2F)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x7FEB352D)
        h ^= h >> np.uint32(15)
        h *= np.uint32(0x846CA68B)
        h ^= h >> np.uint32(16)
    return int(h)


@pytest.mark.parametrize("n", [16, 64, 128, 256])
def test_fwht_is_the_normalized_sylvester_hadamard(n, gen):
    x = torch.randn(5, n, generator=gen, dtype=torch.float64)
    h = torch.tensor(scipy.linalg.hadamard(n), dtype=torch.float64) / np.sqrt(n)
    torch.testing.assert_close(fwht(x), x @ h.T)
    torch.testing.assert_close(fwht(fwht(x)), x)


@pytest.mark.parametrize("n", [8, 96, 512])
def test_fwht_refuses_unsupported_sizes(n):
    with pytest.raises(TQError, match="power-of-two size"):
        fwht(torch.zeros(n))


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 - 1])
def test_sign_hash_matches_the_spec(seed):
    for j in (0, 1, 63, 255):
        assert mix32(seed, j) == mix32_numpy(seed, j)


def test_signs_are_seeded_and_balanced():
    a, b = rotation_signs(7, 4096), rotation_signs(8, 4096)
    assert torch.equal(a, rotation_signs(7, 4096))
    assert not torch.equal(a, b)
    assert set(a.tolist()) == {-1.0, 1.0}
    assert abs(a.mean().item()) < 0.05


def test_seed_must_fit_32_bits():
    with pytest.raises(TQError, match="32 bits"):
        rotation_signs(2**32, 16)


def test_dense_rotation_is_orthogonal_and_seeded():
    q = dense_rotation(3, 96)
    torch.testing.assert_close(q @ q.T, torch.eye(96, dtype=torch.float64))
    assert torch.equal(q, dense_rotation(3, 96))
