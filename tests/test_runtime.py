"""The transformers runtime: TurboQuantCache + the registered attention, on a tiny random Llama."""

import pytest
import torch

from hf_fixtures import tiny_model
from tq_trtllm.calibration.table import oblivious_table
from tq_trtllm.core.errors import TQError
from tq_trtllm.eval.baselines import RoundtripCache
from tq_trtllm.integrations.attention import observe, use_turboquant_attention
from tq_trtllm.integrations.cache import TurboQuantCache
from tq_trtllm.models.fingerprint import fingerprint

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model():
    m = tiny_model()
    use_turboquant_attention(m)
    return m


def table_for(model, bits, sinks=0):
    table = oblivious_table(fingerprint("llama", model.config), bits, bits)
    table.sink_tokens = sinks
    return table


def logits(model, ids, cache):
    with torch.inference_mode():
        return model(input_ids=ids, past_key_values=cache, use_cache=True).logits


def test_four_bits_match_the_fp16_cache_within_a_bound(model, gen):
    """Relative logit error near the codec's own relative error, sqrt(D) = sqrt(0.0095) at 4 bits."""
    ids = torch.randint(4, 60, (2, 48), generator=gen)
    ref = logits(model, ids, RoundtripCache("fp16", 2, 64))
    errors = {}
    for bits in (2, 3, 4):
        out = logits(model, ids, TurboQuantCache(table_for(model, bits)))
        errors[bits] = ((out - ref).norm() / ref.norm()).item()
    assert errors[4] < 1.5 * 0.0095**0.5
    assert errors[4] < errors[3] < errors[2]


def test_cache_holds_exactly_what_the_reference_codec_decodes(model, gen):
    """Layer 0 sees the same raw keys with or without a cache: the pages must hold their roundtrip."""
    ids = torch.randint(4, 60, (1, 20), generator=gen)
    table = table_for(model, 3)
    raw, seen = [], []
    with observe(lambda layer, q, k, v: raw.append((k, v)) if layer == 0 else None), torch.inference_mode():
        model(input_ids=ids, use_cache=False)
    cache = TurboQuantCache(table)
    with observe(lambda layer, q, k, v: seen.append(k) if layer == 0 else None):
        logits(model, ids, cache)
    keys, values = cache.layers[0]._read()
    assert torch.equal(seen[0], keys)  # attention reads what the pages hold
    for codec, x, got in zip(table.codecs(0), raw[0], (keys, values)):
        want = codec.roundtrip(x.transpose(1, 2)).transpose(1, 2)
        assert torch.allclose(got, want, atol=1e-6)


def test_incremental_decoding_equals_one_prefill(model, gen):
    """Appending token by token gives the same cache contents as one prefill."""
    ids = torch.randint(4, 60, (1, 24), generator=gen)
    table = table_for(model, 3, sinks=2)
    full = TurboQuantCache(table)
    logits(model, ids, full)
    step = TurboQuantCache(table)
    logits(model, ids[:, :10], step)
    for t in range(10, 24):
        with torch.inference_mode():
            model(input_ids=ids[:, t:t + 1], past_key_values=step, use_cache=True)
    for a, b in zip(full.layers, step.layers):
        ka, va = a._read()
        kb, vb = b._read()
        assert torch.allclose(ka, kb, atol=1e-6) and torch.allclose(va, vb, atol=1e-6)


def test_sink_tokens_are_exact(model, gen):
    ids = torch.randint(4, 60, (1, 12), generator=gen)
    seen = []
    table = table_for(model, 2, sinks=3)
    cache = TurboQuantCache(table)
    with observe(lambda layer, q, k, v: seen.append((layer, k))):
        logits(model, ids, cache)
    keys, _ = cache.layers[0]._read()
    fp16 = RoundtripCache("fp16", 2, 64)
    logits(model, ids, fp16)
    assert torch.equal(keys[:, :, :3], fp16.layers[0].keys[:, :, :3])
    assert not torch.equal(keys[:, :, 3:], fp16.layers[0].keys[:, :, 3:])


def test_generate_and_byte_accounting(model, gen):
    ids = torch.randint(4, 60, (1, 10), generator=gen)
    table = table_for(model, 3, sinks=1)
    cache = TurboQuantCache(table)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                             max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=2)
    assert out.shape[1] == 16
    cached = cache.get_seq_length()
    assert cached == 15  # the last generated token is never fed back
    assert cache.stored_bytes() == table.cache_bytes(cached)
    assert cache.fp16_bytes() == cached * 2 * 2 * 2 * 64 * 2


def test_beam_search_is_refused_clearly(model):
    cache = TurboQuantCache(table_for(model, 3))
    with pytest.raises(TQError, match="beam search"):
        cache.reorder_cache(torch.tensor([0]))


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_other_families_run_with_the_cache(family, gen):
    """Mistral and Qwen2 call cache.update and the attention interface as Llama does."""
    import transformers

    from tq_trtllm.models.registry import check_config, get_family

    config_class = {"mistral": transformers.MistralConfig, "qwen2": transformers.Qwen2Config}[family]
    config = config_class(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          max_position_embeddings=256, sliding_window=None)
    check_config(get_family(family), config)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    use_turboquant_attention(model)
    ids = torch.randint(0, 64, (1, 24), generator=gen)
    ref = logits(model, ids, RoundtripCache("fp16", 2, 64))
    table = oblivious_table(fingerprint(family, config), 4, 4)
    out = logits(model, ids, TurboQuantCache(table))
    assert ((out - ref).norm() / ref.norm()).item() < 1.5 * 0.0095**0.5


def test_sliding_window_models_are_refused():
    import transformers

    from tq_trtllm.models.registry import check_config, get_family

    config = transformers.MistralConfig(sliding_window=4096)
    with pytest.raises(TQError, match="sliding-window"):
        check_config(get_family("mistral"), config)
