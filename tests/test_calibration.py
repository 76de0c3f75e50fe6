"""Calibration on a tiny random Llama: statistics, scales, outliers, widths under a budget."""

from dataclasses import replace

import pytest
import torch

from hf_fixtures import tiny_model, tiny_text, tiny_tokenizer
from tq_trtllm.calibration.allocate import EFFECTIVE_OVERHEAD, allocate_widths
from tq_trtllm.calibration.calibrate import (CalibrationOptions, balanced_lengths, calibrate, collect_stats,
                                             rotary_mean)
from tq_trtllm.calibration.capture import run_observed, token_windows
from tq_trtllm.calibration.page_mass import lse_inflation, measure_page_shifts
from tq_trtllm.calibration.sensitivity import fisher_gradients
from tq_trtllm.calibration.stats import ChannelStats, output_weights
from tq_trtllm.core.quantizer import VectorCodec
from tq_trtllm.core.rotary_mean import pre_rope, select_pairs
from tq_trtllm.core.spec import CodecSpec
from tq_trtllm.models.checkpoint import LoadedModel
from tq_trtllm.models.registry import get_family, rotary_frequencies

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def loaded():
    return LoadedModel(get_family("llama"), None, tiny_model(), tiny_tokenizer())


def test_stats_match_direct_computation(loaded):
    windows = token_windows(loaded.tokenizer, tiny_text(200), 64, 2)
    stats = collect_stats(loaded.model, windows, skip=1, context=64)
    assert len(stats) == 2 and stats[0].tokens == 2 * 63
    s = stats[1]
    assert s.key_mean.shape == (2, 64) and torch.isfinite(s.key_mean).all()
    assert (s.key_power(centred=True) >= -1e-9).all()
    scale = s.key_scale(centred=True)
    assert (scale > 0).all()
    assert torch.allclose(scale.log().mean(dim=-1), torch.zeros(2, dtype=torch.float64), atol=1e-9)
    o_proj = loaded.model.model.layers[1].self_attn.o_proj.weight
    assert torch.equal(s.value_weight, output_weights(o_proj, 2, 64))
    # the key mean and power over the context's 64 positions, from the captured post-RoPE keys
    # themselves: each key k_t (position t = 1 .. 63) stands at every position p = 0 .. 63 as
    # R(p - t) k_t, R transformers' rotate-half rotation at the model's own frequencies
    inv_freq = loaded.model.model.rotary_emb.inv_freq.double()
    for layer, (_, k) in _captured(loaded.model, windows).items():  # k [windows, H, 64, d]
        keys = k[:, :, 1:]
        turn = (torch.arange(64.0)[:, None] - torch.arange(1.0, 64.0))[..., None] * inv_freq  # [p, t, d/2]
        cos, sin = torch.cat([turn.cos()] * 2, -1), torch.cat([turn.sin()] * 2, -1)
        half = keys.shape[-1] // 2
        rotated = torch.cat([-keys[..., half:], keys[..., :half]], -1)
        placed = keys[:, :, None] * cos + rotated[:, :, None] * sin  # [windows, H, p, t, d]
        mean = placed.mean(dim=(0, 2, 3))
        # float32 keys and RoPE angles: agreement to about 1e-7 of the keys' scale, not to float64's
        torch.testing.assert_close(stats[layer].key_mean, mean, rtol=1e-5, atol=1e-6)
        power = placed.square().mean(dim=(0, 2, 3))
        torch.testing.assert_close(stats[layer].key_power(centred=False), power, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(stats[layer].key_power(centred=True), power - mean**2, rtol=1e-5,
                                   atol=1e-6)


def _captured(model, windows):
    """Every layer's post-RoPE q and k over the windows, float64."""
    out = {}
    run_observed(model, windows, lambda layer, q, k, v: out.update(
        {layer: (q.detach().double(), k.detach().double())}))
    return out


def test_rotary_means_hold_the_largest_pre_rope_key_means(loaded):
    windows = token_windows(loaded.tokenizer, tiny_text(200), 64, 2)
    stats = collect_stats(loaded.model, windows, skip=1, context=64)
    inv_freq = rotary_frequencies(loaded.model)
    for layer, (_, k) in _captured(loaded.model, windows).items():  # k [windows, H, T, d]
        pre = pre_rope(k[:, :, 1:], torch.arange(1, 64), inv_freq).mean(dim=(0, 2))
        torch.testing.assert_close(stats[layer].pre_rope_key_mean, pre)
        rotary, _ = rotary_mean(stats[layer], pairs=4, skip=1)
        energy = pre[:, :32] ** 2 + pre[:, 32:] ** 2
        assert rotary.channels.tolist() == energy.topk(4).indices.sort().values.tolist()
        # stated at packed position 0, which is sequence position 1 (one exact sink token)
        torch.testing.assert_close(rotary.mean, select_pairs(pre, inv_freq, 4, offset=1).mean)


def test_key_statistics_are_those_of_the_keys_less_their_rotary_mean(loaded):
    windows = token_windows(loaded.tokenizer, tiny_text(200), 64, 2)
    stats = collect_stats(loaded.model, windows, skip=1, context=64)
    for layer, (_, k) in _captured(loaded.model, windows).items():
        rotary, less = rotary_mean(stats[layer], pairs=16, skip=1)
        packed = torch.arange(63)  # sequence positions 1 .. 63
        turned = rotary.vectors(packed, 64).transpose(0, 1)  # [H, T, d]
        # the sums of keys less R(p) m, RoPE undone at their sequence positions
        pre = pre_rope(k[:, :, 1:] - turned, torch.arange(1, 64), stats[layer].inv_freq)
        torch.testing.assert_close(less.k_sum, pre.sum(dim=(0, 2)))
        a, b = pre[..., :32], pre[..., 32:]
        torch.testing.assert_close(less.k_pairs, torch.stack([a * a, b * b, a * b], -1).sum(dim=(0, 2)))
        assert less.key_power(centred=True).sum() < stats[layer].key_power(centred=True).sum()
        assert torch.equal(less.v_sum, stats[layer].v_sum)  # values untouched


def test_post_rope_statistics_stand_for_the_context(gen):
    """Windows whose RoPE-free content is the same at every position: their post-RoPE statistics
    over positions 0 .. T - 1 are exactly the context's averages of the turned moments."""
    inv_freq = torch.tensor([1.0, 0.3, 0.01, 0.0], dtype=torch.float64)
    content = torch.randn(5, 2, 1, 8, generator=gen, dtype=torch.float64) + torch.arange(8.0)
    t = 40
    angle = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    rotate_half = lambda x: torch.cat([-x[..., 4:], x[..., :4]], -1)  # noqa: E731
    post = content * cos + rotate_half(content) * sin  # transformers' RoPE, [5, 2, T, 8]
    stats = ChannelStats.zeros(2, 8, inv_freq, context=t)
    stats.add(post, post, post, skip=0)
    flat = post.transpose(1, 2).reshape(-1, 2, 8)
    torch.testing.assert_close(stats.key_mean, flat.mean(0))
    torch.testing.assert_close(stats.key_power(centred=True), flat.var(0, unbiased=False))
    torch.testing.assert_close(stats.query_power, flat.square().mean(0))
    # a longer context turns the fast pairs' energy evenly between their two channels
    long = ChannelStats.zeros(2, 8, inv_freq, context=100_000)
    long.add(post, post, post, skip=0)
    power = long.key_power(centred=False)
    torch.testing.assert_close(power[:, 0], power[:, 4], rtol=1e-3, atol=0)
    assert not torch.allclose(power[:, 3], power[:, 7], rtol=0.1)  # no turn at frequency 0


def test_key_scale_is_the_fourth_root_rule():
    s = ChannelStats.zeros(1, 4, torch.zeros(2), context=10)  # no RoPE
    k = torch.tensor([[[[1.0, 2.0, 4.0, 8.0]]]]).expand(1, 1, 10, 4)
    q = torch.tensor([[[[8.0, 4.0, 2.0, 1.0]]]]).expand(1, 1, 10, 4)
    s.add(q, k, k, skip=0)
    scale = s.key_scale(centred=False)[0]
    # s_c = (k_c^2 / q_c^2)^(1/4) = sqrt(k_c / q_c), up to a common factor
    ratio = scale / scale[0]
    assert torch.allclose(ratio, torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64))


def _log_error(keys, queries, s):
    """sum over lengths of log E_L(s) = log(sum K / s^2) + log(sum Q s^2), per head."""
    return ((keys / s**2).sum(-1).log() + (queries * s**2).sum(-1).log()).sum(0)


def test_length_balanced_key_scale_minimizes_the_summed_log_error(gen):
    inv_freq = torch.tensor([1.0, 0.05, 0.002, 0.0], dtype=torch.float64)
    s = ChannelStats.zeros(2, 8, inv_freq, context=64)
    q, k = (torch.randn(3, 2, 64, 8, generator=gen, dtype=torch.float64) * torch.arange(1.0, 9.0)
            for _ in range(2))
    s.add(q, k, k, skip=0)
    lengths = (100, 400, 3000)
    balanced = s.key_scale(True, lengths)
    # keys over positions 0 .. n - 1; queries over the last quarter, turned here from their moments
    keys = torch.stack([replace(s, context=n).key_power(True) for n in lengths])
    aa, bb, ab = (s.q_pairs / s.tokens).unbind(-1)
    queries = []
    for n in lengths:
        angle = torch.arange(n - n // 4, n, dtype=torch.float64)[:, None] * inv_freq
        cc, ss, cs = (angle.cos() ** 2).mean(0), (angle.sin() ** 2).mean(0), \
            (angle.cos() * angle.sin()).mean(0)
        queries.append(torch.cat([aa * cc + bb * ss - 2 * ab * cs, bb * cc + aa * ss + 2 * ab * cs], -1))
    queries = torch.stack(queries)
    # one length: the fourth-root rule over that length's keys and the last quarter's queries
    rule = (keys[1] / queries[1]) ** 0.25
    torch.testing.assert_close(s.key_scale(True, (400,)), rule / rule.log().mean(-1, keepdim=True).exp())
    best = _log_error(keys, queries, balanced)
    # a stationary point of a convex function: no nudge of any channel lowers it
    for c in range(8):
        for f in (0.98, 1.02):
            nudged = balanced.clone()
            nudged[:, c] *= f
            assert (_log_error(keys, queries, nudged) > best - 1e-12).all()
    # and below each length's own fourth-root scale
    for n in lengths:
        assert (best <= _log_error(keys, queries, s.key_scale(True, (n,))) + 1e-12).all()


def test_value_scale_is_the_fourth_root_rule_with_output_weights():
    s = ChannelStats.zeros(1, 4, torch.zeros(2), 10, value_weight=torch.tensor([[1.0, 16.0, 1.0, 16.0]], dtype=torch.float64))
    v = torch.tensor([[[[1.0, 2.0, 4.0, 8.0]]]]).expand(1, 1, 10, 4)
    s.add(v, v, v, skip=0)
    # s_c = (v_c^2 / w_c)^(1/4) = sqrt(v_c) / w_c^(1/4), geometric mean 1
    want = torch.tensor([1.0, 2**0.5 / 2, 2.0, 8**0.5 / 2], dtype=torch.float64)
    assert torch.allclose(s.value_scale(centred=False)[0], want / want.log().mean().exp())
    # outliers: the largest sqrt(v_c^2 w_c) with the scale, the largest v_c^2 without
    assert s.value_outliers(2, centred=False, scaled=True)[0].tolist() == [1, 3]
    assert s.value_outliers(2, centred=False, scaled=False)[0].tolist() == [2, 3]


def test_output_weights_sum_the_groups_o_proj_columns(gen):
    kv_heads, group, head_dim = 2, 3, 16
    o_proj = torch.randn(40, kv_heads * group * head_dim, generator=gen)
    weights = output_weights(o_proj, kv_heads, head_dim)
    for h in range(kv_heads):
        for c in range(head_dim):
            cols = [(h * group + g) * head_dim + c for g in range(group)]
            assert weights[h, c].item() == pytest.approx(o_proj[:, cols].double().square().sum().item())


def test_value_scale_cuts_the_output_weighted_error_as_predicted(gen):
    """Channel powers a_c and output weights w_c in opposite orders: the weighted error
    sum_c w_c E[e_c^2] falls by the predicted (sum_c sqrt(a_c w_c))^2 / (sum_c a_c sum_c w_c)."""
    a = torch.logspace(-1, 1, 64, dtype=torch.float64)
    w = a.flip(0)
    s = ChannelStats.zeros(1, 64, torch.zeros(32), 4000, value_weight=w[None])
    v = torch.randn(1, 1, 4000, 64, generator=gen, dtype=torch.float64) * a.sqrt()
    s.add(v, v, v, skip=0)
    power = s.value_power(centred=False)[0]
    predicted = (power * w).sqrt().sum() ** 2 / (power.sum() * w.sum())
    errors = [((VectorCodec(CodecSpec(64, 3), seed=3, scale=scale).roundtrip(v[0, 0]) - v[0, 0]) ** 2
               * w).sum() for scale in (None, s.value_scale(centred=False)[0])]
    assert predicted < 0.3
    assert errors[1] / errors[0] == pytest.approx(predicted.item(), rel=0.15)


def test_calibrated_table_is_sane(loaded):
    opts = CalibrationOptions(window=64, windows=2, fisher_windows=1, fisher_samples=2, sink_tokens=1)
    table = calibrate(loaded, tiny_text(400), "3", opts, source="tiny")
    key_avg, value_avg = table.average_widths()
    assert (key_avg + value_avg) / 2 <= 3.0 + 1e-9
    assert table.effective_bits(1024) <= 3.0 + EFFECTIVE_OVERHEAD + 1e-9
    for layer in table.layers:
        assert layer.key_mean.shape == (2, 64) and (layer.key_scale > 0).all()
        for width, outliers in ((layer.key_width, layer.key_outliers),
                                (layer.value_width, layer.value_outliers)):
            assert (outliers is None) == float(width).is_integer()
    assert table.calibration["source"] == "tiny" and "fisher_costs" in table.calibration
    assert table.calibration["stats_context"] == 256  # the default 2,048, cut to the model's limit
    # the key scale balanced over the lengths up to the model's limit: here the limit alone
    assert list(table.calibration["key_scale_lengths"]) == [256]


def test_balanced_lengths_double_from_1024_to_the_context():
    assert balanced_lengths(8192) == (1024, 2048, 4096, 8192)
    assert balanced_lengths(3000) == (1024, 2048, 3000)
    assert balanced_lengths(256) == (256,)


def test_value_scale_option_reaches_the_value_codec(loaded):
    opts = CalibrationOptions(window=64, windows=1, value_scale=True)
    table = calibrate(loaded, tiny_text(200), "k3v2.5", opts)
    stats = collect_stats(loaded.model, token_windows(loaded.tokenizer, tiny_text(200), 64, 1), skip=0,
                          context=64)
    for layer, s in zip(table.layers, stats):
        assert torch.equal(layer.value_scale, s.value_scale(centred=False).float())
        assert torch.equal(layer.value_outliers, s.value_outliers(32, centred=False, scaled=True))
        assert torch.equal(layer.codecs(64)[1].scale, layer.value_scale.double())
    plain = calibrate(loaded, tiny_text(200), "k3v2.5", CalibrationOptions(window=64, windows=1))
    assert all(layer.value_scale is None for layer in plain.layers)


def test_pair_widths_are_uniform(loaded):
    opts = CalibrationOptions(window=64, windows=1)
    table = calibrate(loaded, tiny_text(200), "k4v2", opts)
    assert [(t.key_width, t.value_width) for t in table.layers] == [(4.0, 2.0)] * 2


def test_allocation_prefers_sensitive_layers_and_respects_the_budget():
    # layer 0 keys are 100x more sensitive than everything else
    costs = {(layer, kind): {w: (100.0 if (layer, kind) == (0, 0) else 1.0) * 4.0 ** -w
                             for w in (2.0, 3.0, 4.0)}
             for layer in range(4) for kind in range(2)}
    widths = allocate_widths(costs, 3.0, lambda w: int(w * 8 + 2), lambda w: sum(w.values()) / len(w))
    assert widths[(0, 0)] == 4.0
    assert sum(widths.values()) / len(widths) <= 3.0


def test_too_little_text_is_refused(loaded):
    from tq_trtllm.core.errors import TQError

    with pytest.raises(TQError, match="too few tokens"):
        calibrate(loaded, "the a of", "3", CalibrationOptions(window=64))


class _CharTokenizer:
    """One token per character: enough to read the windows back exactly."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_retrieval_windows_need_copying_and_differ_from_the_evaluation():
    from tq_trtllm.calibration.retrieval import FILLER_TOKENS, retrieval_windows
    from tq_trtllm.core.errors import TQError

    tok, text = _CharTokenizer(), tiny_text(400)
    rows = retrieval_windows(tok, text, 600, 3, seed=0)
    assert rows.shape == (3, 600) and rows.dtype == torch.int64
    assert torch.equal(rows, retrieval_windows(tok, text, 600, 3, seed=0))
    assert not torch.equal(rows, retrieval_windows(tok, text, 600, 3, seed=1))
    keys = set()
    for row in rows:
        window = tok.decode(row.tolist())
        key = window.rsplit("magic number is", 1)[1].strip(" .")
        assert len(key) == 5 and key.isdigit()
        assert window.count(key) == 3  # twice in the needle, once as the answer at the end
        assert window.endswith(f"the magic number is {key}.")
        assert "pass key" not in window.lower()
        filler = window[:window.index(" Note this well")]
        assert filler and filler[:FILLER_TOKENS] in text  # a stretch of the calibration text
        keys.add(key)
    assert len(keys) == 3
    assert retrieval_windows(tok, text, 600, 0).shape == (0, 600)
    with pytest.raises(TQError, match="more than"):
        retrieval_windows(tok, text, 50, 1)


def test_retrieval_windows_enter_the_fisher_costs(loaded):
    base = CalibrationOptions(window=64, windows=1, fisher_windows=1, fisher_samples=1, sink_tokens=1,
                              retrieval_windows=0)
    plain = calibrate(loaded, tiny_text(400), "3", base)
    opts = CalibrationOptions(**{**base.__dict__, "retrieval_windows": 2})
    with_retrieval = calibrate(loaded, tiny_text(400), "3", opts)
    assert with_retrieval.calibration["retrieval_windows"] == 2
    a, b = plain.calibration["fisher_costs"], with_retrieval.calibration["fisher_costs"]
    assert a.keys() == b.keys()
    # the costs are sums over windows: two more windows add to every slot's cost
    assert all(b[slot][w] > a[slot][w] for slot in a for w in a[slot])


@pytest.mark.parametrize("recent", [1, 4])
def test_fisher_gradients_come_from_the_queries_beyond_the_window(loaded, recent):
    windows = token_windows(loaded.tokenizer, tiny_text(200), 32, 1)
    captured = fisher_gradients(loaded.model, windows, samples=1, seed=0, recent=recent)
    k, _, grads_k, grads_v = captured[1]
    t = k.shape[2]
    for g in (grads_k[0], grads_v[0]):
        per_token = g.abs().sum(dim=(0, 1, 3))
        # position p is read through the cache only by queries at p + recent and later
        assert torch.all(per_token[t - recent:] == 0)
        assert torch.all(per_token[: t - recent] > 0)
    # the rule changes what the gradients count, not what the model computes
    sdpa = run_observed(loaded.model, windows, lambda *a: None)
    ruled = run_observed(loaded.model, windows, lambda l, q, key, v: setattr(
        key, "tq_exact", (key.detach(), v.detach(), recent)))
    assert torch.allclose(sdpa, ruled, atol=1e-4)


def test_lse_inflation_is_half_the_logit_noise_variance(gen):
    """Logit noise e ~ N(0, sigma^2) independent of the logits grows the mass of many keys by
    E[exp(e)] = exp(sigma^2 / 2): the measured shift must find sigma^2 / 2."""
    hq, hkv, t, d, sigma = 4, 2, 800, 64, 0.6
    q = torch.randn(hq, t, d, generator=gen, dtype=torch.float64)
    q = q / q.norm(dim=-1, keepdim=True) * d**0.5  # |q| = sqrt(d): logit noise std = sigma
    k = 0.3 * torch.randn(hkv, t, d, generator=gen, dtype=torch.float64)
    k_hat = k + sigma * torch.randn(hkv, t, d, generator=gen, dtype=torch.float64)
    shift = lse_inflation(q, k, k_hat, d**-0.5, first=1, recent=4)
    assert shift.shape == (hq,)
    assert torch.allclose(shift, torch.full((hq,), sigma**2 / 2, dtype=torch.float64), atol=0.03)
    assert torch.equal(lse_inflation(q, k, k, d**-0.5, first=1, recent=4), torch.zeros(hq, dtype=torch.float64))


def test_lse_inflation_counts_only_the_keys_read_through_the_pages(gen):
    """Keys before `first` (exact sinks) and each row's `recent` last positions (exact window)
    are never read from the pages: noise on them alone must measure exactly zero."""
    q, k = torch.randn(2, 40, 64, generator=gen), torch.randn(1, 40, 64, generator=gen)
    k_hat = k.clone()
    k_hat[:, :3] += 1.0  # the sinks
    k_hat[:, -4:] += 1.0  # read from the pages only by rows beyond the window's end
    assert torch.equal(lse_inflation(q, k, k_hat, 0.125, first=3, recent=4),
                       torch.zeros(2, dtype=torch.float64))
    k_hat[:, 3] += 1.0  # the first packed key: rows from 3 + recent on read it from the pages
    assert (lse_inflation(q, k, k_hat, 0.125, first=3, recent=4) != 0).all()


def test_calibrated_tables_carry_the_measured_page_shifts(loaded):
    opts = CalibrationOptions(window=64, windows=2, sink_tokens=1, recent_tokens=4)
    text = tiny_text(400)
    table = calibrate(loaded, text, "k2v3", opts)
    windows = token_windows(loaded.tokenizer, text, 64, 2)
    assert [layer.page_lse_shift.shape for layer in table.layers] == [(4,)] * 2
    for got, want in zip((layer.page_lse_shift for layer in table.layers),
                         measure_page_shifts(loaded.model, windows, table)):
        assert torch.equal(got, want)
    plain = calibrate(loaded, text, "k2v3", CalibrationOptions(window=64, windows=2, page_shift=False))
    assert all(layer.page_lse_shift is None for layer in plain.layers)


def test_a_rope_the_statistics_cannot_model_is_refused_with_the_way_out(loaded, monkeypatch):
    from tq_trtllm.core.errors import TQError

    monkeypatch.setattr(loaded.model.model.rotary_emb, "attention_scaling", 1.5, raising=False)
    with pytest.raises(TQError, match="--oblivious"):
        calibrate(loaded, tiny_text(200), "3", CalibrationOptions(window=64, windows=1))
