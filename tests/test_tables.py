"""Calibration tables: save/load round trip, and refusal of mismatched or damaged tables."""

import json

import pytest
import torch

from tq_trtllm.calibration.table import KVTable, LayerTable, oblivious_table
from tq_trtllm.calibration.tables_io import HEADER_KEY, load_table, save_table
from tq_trtllm.core.errors import TQError

FP = {"family": "llama", "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 64, "config_hash": "abc"}


def calibrated_table(gen) -> KVTable:
    """Layer 0 has every key table (a rotary mean of 3 pairs included), layer 1 the value tables
    and the widest widths (5-bit keys, 4.5-bit values)."""
    a = torch.tensor([[0, 5, 31], [2, 3, 4]])
    layers = [
        LayerTable(3.5, 3.0, 7, key_mean=torch.randn(2, 64, generator=gen),
                   key_scale=torch.rand(2, 64, generator=gen) + 0.5,
                   key_outliers=torch.stack([torch.randperm(64, generator=gen)[:32].sort().values
                                             for _ in range(2)]),
                   page_lse_shift=torch.rand(4, generator=gen) * 0.3,
                   key_rotary_channels=a,
                   key_rotary_freq=torch.rand(2, 3, generator=gen) + 0.01,
                   key_rotary_mean=torch.randn(2, 3, 2, generator=gen)),
        LayerTable(5.0, 4.5, 8, value_mean=torch.randn(2, 64, generator=gen),
                   value_scale=torch.rand(2, 64, generator=gen) + 0.5,
                   value_outliers=torch.arange(32).repeat(2, 1)),
    ]
    return KVTable(FP, layers, 2, "3", {"mode": "calibrated", "source": "test"}, recent_tokens=5)


def test_round_trip(tmp_path, gen):
    table = calibrated_table(gen)
    save_table(table, tmp_path / "t.safetensors")
    back = load_table(tmp_path / "t.safetensors", FP)
    assert back.fingerprint == FP and back.sink_tokens == 2 and back.kv_bits == "3"
    assert back.recent_tokens == 5
    assert back.calibration == table.calibration
    for a, b in zip(table.layers, back.layers):
        assert (a.key_width, a.value_width, a.seed) == (b.key_width, b.value_width, b.seed)
        for name in LayerTable.TENSORS:
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or torch.equal(x, y)
    x, pos = torch.randn(5, 2, 64, generator=gen), torch.arange(5)
    for layer in range(2):
        for kind in range(2):
            assert torch.equal(table.codecs(layer)[kind].roundtrip(x, pos),
                               back.codecs(layer)[kind].roundtrip(x, pos))
    assert torch.equal(back.codecs(1)[1].scale, table.layers[1].value_scale.double())
    assert not list(tmp_path.glob("*.tmp"))


def test_mismatched_model_is_refused_naming_fields(tmp_path):
    save_table(oblivious_table(FP, 3, 3), tmp_path / "t.safetensors")
    other = {**FP, "kv_heads": 4, "config_hash": "def"}
    with pytest.raises(TQError, match=r"kv_heads: table has 2, model has 4.*|config_hash") as err:
        load_table(tmp_path / "t.safetensors", other)
    assert "kv_heads" in str(err.value) and "config_hash" in str(err.value)


def test_corrupt_file_is_refused(tmp_path, gen):
    path = tmp_path / "t.safetensors"
    save_table(calibrated_table(gen), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TQError, match="corrupt"):
        load_table(path)
    path.write_bytes(b"not a table at all")
    with pytest.raises(TQError, match="corrupt"):
        load_table(path)
    with pytest.raises(TQError, match="does not exist"):
        load_table(tmp_path / "missing.safetensors")


def _rewrite_header(path, edit):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as fh:
        header = json.loads(fh.metadata()[HEADER_KEY])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    edit(header, tensors)
    save_file(tensors, str(path), metadata={HEADER_KEY: json.dumps(header)})


@pytest.mark.parametrize("edit, message", [
    (lambda h, t: h.update(version=99), "version 99"),
    (lambda h, t: h["layers"][0].update(key_width=6), "not supported"),
    (lambda h, t: h["layers"].pop(), "lists 1 layers"),
    (lambda h, t: t.update({"layers.0.key_mean": torch.zeros(3, 64)}), r"shape \[3, 64\]"),
    (lambda h, t: t.update({"layers.0.key_scale": -torch.ones(2, 64)}), "not positive"),
    (lambda h, t: t.update({"layers.1.value_scale": torch.zeros(2, 64)}), "not positive"),
    (lambda h, t: t.update({"layers.1.value_scale": torch.ones(2, 32)}), r"value_scale has shape \[2, 32\]"),
    (lambda h, t: t.update({"layers.0.key_mean": torch.full((2, 64), float("nan"))}), "NaN"),
    (lambda h, t: t.update({"layers.0.key_outliers": torch.full((2, 32), 64)}), "channel indices"),
    (lambda h, t: h.pop("fingerprint"), "malformed header"),
    (lambda h, t: h.update(recent_tokens=0), r"recent_tokens 0 lies outside 1\.\.64"),
    (lambda h, t: t.update({"layers.0.page_lse_shift": torch.zeros(2)}), r"shape \[4\], one per query"),
    (lambda h, t: t.update({"layers.0.page_lse_shift": torch.zeros(4, dtype=torch.float64)}),
     "must be float32"),
    (lambda h, t: t.update({"layers.1.page_lse_shift": torch.full((4,), 9.0)}), "outside"),
    (lambda h, t: t.update({"layers.1.page_lse_shift": torch.full((4,), float("nan"))}), "NaN"),
    (lambda h, t: t.pop("layers.0.key_rotary_freq"), "rotary mean is incomplete"),
    (lambda h, t: t.update({"layers.0.key_rotary_channels": torch.tensor([[0, 0, 1]] * 2)}),
     "not distinct rotate-half pairs"),
    (lambda h, t: t.update({"layers.0.key_rotary_channels": torch.tensor([[0, 32, 1]] * 2)}),
     "not distinct rotate-half pairs"),
    (lambda h, t: t.update({"layers.0.key_rotary_channels": torch.tensor([[[0, 32]] * 3] * 2)}),
     r"channels of shape \[2, 3\]"),
    (lambda h, t: t.update({"layers.0.key_rotary_freq": torch.full((2, 3), 4.0)}), r"outside \(0, pi\]"),
    (lambda h, t: t.update({"layers.0.key_rotary_mean": torch.full((2, 3, 2), float("inf"))}), "NaN/Inf"),
    (lambda h, t: t.update({"layers.0.key_rotary_mean": torch.zeros(2, 4, 2)}), r"shape \[2, 3, 2\]"),
    (lambda h, t: t.update({"layers.0.key_rotary_mean": torch.zeros(2, 3, 2, dtype=torch.float64)}),
     "must be int64 channels and float32"),
    (lambda h, t: t.update({"layers.0.key_rotary_freq": torch.ones(3, 3)}), "expected 2 heads"),
])
def test_damaged_header_or_tensors_are_refused(tmp_path, gen, edit, message):
    path = tmp_path / "t.safetensors"
    save_table(calibrated_table(gen), path)
    _rewrite_header(path, edit)
    with pytest.raises(TQError, match=message):
        load_table(path)


def test_side_bytes_count_means_and_scales_at_fp32_and_outliers_at_one_byte(gen):
    # layer 0: key mean, key scale, 32 key outliers, 4 shifts, 3 rotary pairs (a one-byte channel,
    # fp32 frequency and mean pair each); layer 1: value mean, value scale, 32 value outliers
    rotary = 2 * 3 * (1 + 4 + 2 * 4)
    assert calibrated_table(gen).side_bytes() == 2 * (2 * 2 * 64 * 4 + 2 * 32) + 4 * 4 + rotary


def test_effective_bits_count_every_byte():
    table = oblivious_table(FP, 3, 3)
    # head_dim 64, 3 bits: 24 code bytes + 2 norm bytes per token and head = 3.25 bits
    assert table.effective_bits(1024) == pytest.approx(3.25)
    table.sink_tokens = 4
    exact = 4 * 2 * 2 * 2 * 64 * 2  # tokens x layers x K/V x heads x head_dim x fp16
    packed = 1020 * 2 * 2 * 2 * 26
    assert table.cache_bytes(1024) == exact + packed
    table.recent_tokens = 8  # 7 more rows in fp16 beside the pages (which hold every token)
    assert table.cache_bytes(1024) == exact + packed + 7 * 2 * 2 * 2 * 64 * 2
    assert table.cache_bytes(6) == exact + 2 * 2 * 2 * 2 * 26 + 2 * 2 * 2 * 2 * 64 * 2
