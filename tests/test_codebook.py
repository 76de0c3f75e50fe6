"""Lloyd-Max codebooks against the published values (turboquant-notes.md, section 1), and their
8-bit grid (FORMAT.md section 1)."""

import numpy as np
import pytest

from tq_trtllm.core.codebook import lloyd_max, mse_per_coordinate, on_grid
from tq_trtllm.core.errors import TQError

# Positive half of the Lloyd-Max quantizer for N(0, 1) (Max 1960; TurboQuant section 3).
GAUSSIAN_POSITIVE = {
    1: [0.7979],
    2: [0.4528, 1.5104],
    3: [0.2451, 0.7560, 1.3439, 2.1519],
    4: [0.1284, 0.3880, 0.6568, 0.9423, 1.2562, 1.6180, 2.0690, 2.7326],
}
GAUSSIAN_MSE = {1: 0.3634, 2: 0.1175, 3: 0.03455, 4: 0.009497}
EXACT_D128_3BIT = [0.2444, 0.7533, 1.3366, 2.1315]


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_gaussian_centroids_match_published_values(bits):
    c = lloyd_max(128, bits, "gaussian") * np.sqrt(128)
    np.testing.assert_allclose(c[2**bits // 2:], GAUSSIAN_POSITIVE[bits], atol=1e-4)


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_gaussian_distortion_matches_published_values(bits):
    assert mse_per_coordinate(128, bits, "gaussian") * 128 == pytest.approx(GAUSSIAN_MSE[bits], rel=1e-3)


def test_exact_marginal_at_d128_is_slightly_narrower():
    c = lloyd_max(128, 3, "exact") * np.sqrt(128)
    np.testing.assert_allclose(c[4:], EXACT_D128_3BIT, atol=1e-4)


@pytest.mark.parametrize("dim", [16, 32, 64, 256])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
def test_codebook_is_symmetric_ascending_and_a_fixed_point(dim, bits):
    c = lloyd_max(dim, bits)
    assert len(c) == 2**bits
    assert np.all(np.diff(c) > 0)
    np.testing.assert_allclose(c, -c[::-1], atol=1e-15)
    # Lloyd's condition: each centroid is the mean of its cell under the exact density.
    y = np.linspace(-1, 1, 2_000_001)
    w = np.power(np.clip(1 - y * y, 0, None), (dim - 3) / 2)
    cell = np.searchsorted((c[1:] + c[:-1]) / 2, y)
    means = np.array([np.sum(y[cell == k] * w[cell == k]) / np.sum(w[cell == k]) for k in range(len(c))])
    np.testing.assert_allclose(means, c, atol=1e-5)


def test_exact_approaches_gaussian_in_high_dimension():
    exact, gauss = lloyd_max(4096, 3, "exact"), lloyd_max(4096, 3, "gaussian")
    np.testing.assert_allclose(exact, gauss, rtol=2e-3)


@pytest.mark.parametrize("bits", [0, 6])
def test_bits_outside_1_to_5_are_refused(bits):
    with pytest.raises(TQError, match="bits per coordinate is not supported"):
        lloyd_max(128, bits)


def test_unknown_kind_is_refused():
    with pytest.raises(TQError, match="codebook kind"):
        lloyd_max(128, 3, "laplace")


def _distortion(levels, dim):
    """E[(y - nearest level)^2] under the exact density of one coordinate (numeric integration)."""
    y = np.linspace(-1, 1, 2_000_001)
    w = np.power(np.clip(1 - y * y, 0, None), (dim - 3) / 2)
    nearest = levels[np.searchsorted((levels[1:] + levels[:-1]) / 2, y)]
    return np.sum(w * (y - nearest) ** 2) / np.sum(w)


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
def test_grid_levels_are_float32_multiples_of_a_127th_of_the_largest(dim, bits):
    c = lloyd_max(dim, bits)
    g = on_grid(c)
    m = np.abs(g).max()
    i = g * 127 / m
    np.testing.assert_allclose(i, np.rint(i), atol=1e-4)
    assert np.abs(np.rint(i)).max() == 127
    assert np.all(np.abs(g - c) <= m / 254 * (1 + 1e-6))  # the nearest step
    assert np.array_equal(g, g.astype(np.float32).astype(np.float64))
    assert np.array_equal(on_grid(g), g)  # a codebook on its grid stays as it is
    # what the grid costs against the Lloyd-Max levels (FORMAT.md: under 0.05% to 3 bits, 0.1-0.2%
    # at 4, 1-1.8% at 5); a bound that would catch a coarser grid or a wrong rounding
    bound = {1: 1e-6, 2: 1e-3, 3: 1e-3, 4: 3e-3, 5: 2.5e-2}[bits]
    assert _distortion(g, dim) <= _distortion(c, dim) * (1 + bound)


def test_grid_refuses_levels_that_share_a_step():
    with pytest.raises(TQError, match="same step of the 8-bit grid"):
        on_grid([-1.0, 0.001, 0.002, 1.0])
