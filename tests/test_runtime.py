"""The transformers runtime: TurboQuantCache + the registered attention, on a tiny random Llama."""

import pytest
import torch

from cache_bytes import held_bytes, written_slots
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


# The codec's relative MSE D per width (Lloyd-Max on a Gaussian coordinate, test_codebook.py)
DISTORTION = {2: 0.1175, 3: 0.03454, 4: 0.009497, 5: 0.002499}


def test_four_and_five_bits_match_the_fp16_cache_within_a_bound(model, gen):
    """The relative logit error scales with the codec's relative error sqrt(D): on this model and
    prompt it is 0.56 sqrt(D) at 3 and 4 bits, 0.47 sqrt(D) at 5 (0.105, 0.054, 0.023). Bounds of
    0.75 sqrt(D) (0.073 at 4 bits, 0.037 at 5) leave a third of room and fail one bit less (a 3-bit
    error, 0.105, at 4 bits; a 4-bit one at 5). Each added bit must divide the error about as it
    divides sqrt(D) (by 1.84, 1.91 and 1.95 from 2 to 5 bits; the error here by 2.2, 1.9 and 2.3,
    over three other prompts by 1.7-2.4): at least by 1.4."""
    ids = torch.randint(4, 60, (2, 48), generator=gen)
    # one prompt whose rows read one another through the cache, as decode steps would
    ref = logits(model, ids, RoundtripCache("fp16", 2, 64, chunk_reads="cache"))
    errors = {}
    for bits in (2, 3, 4, 5):
        out = logits(model, ids, TurboQuantCache(table_for(model, bits), chunk_reads="cache"))
        errors[bits] = ((out - ref).norm() / ref.norm()).item()
    for bits in (4, 5):
        assert errors[bits] < 0.75 * DISTORTION[bits]**0.5, (bits, errors)
    for bits in (3, 4, 5):
        assert errors[bits] < errors[bits - 1] / 1.4, (bits, errors)


def test_cache_holds_exactly_what_the_reference_codec_decodes(model, gen):
    """Layer 0 sees the same raw keys with or without a cache: the pages must hold their roundtrip."""
    ids = torch.randint(4, 60, (1, 20), generator=gen)
    table = table_for(model, 3)
    raw = []
    with observe(lambda layer, q, k, v: raw.append((k, v)) if layer == 0 else None), torch.inference_mode():
        model(input_ids=ids, use_cache=False)
    cache = TurboQuantCache(table)
    logits(model, ids, cache)
    for codec, x, got in zip(table.codecs(0), raw[0], cache.layers[0].read_dense()):
        want = codec.roundtrip(x.transpose(1, 2)).transpose(1, 2)
        assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("recent, shifted, chunk_reads", [
    (1, False, "cache"), (3, False, "cache"), (3, True, "cache"), (1, False, "exact"), (3, True, "exact")])
def test_attention_in_place_equals_dense_attention_over_the_cache(model, gen, recent, shifted,
                                                                  chunk_reads):
    """packed_attention (sinks exact, the recent window from the rows as computed, older packed
    tokens in place, merged by log-sum-exp; the pages' log-sum-exp lowered by the table's shift)
    against one softmax over the cache read back with the same exact rows and the shift taken from
    the packed tokens' logits, for a prefill whose first rows see sinks only, decode steps and a
    chunk. Under chunk_reads "exact" a step's rows read every row held as computed (the kept
    window and the step's own) up to their own position; under "cache" their recent window."""
    from tq_trtllm.integrations.packed_attention import attend, dense_attention

    ids = torch.randint(4, 60, (1, 30), generator=gen)
    table = table_for(model, 3, sinks=2)
    table.recent_tokens = recent
    heads = model.config.num_attention_heads
    for layer in table.layers if shifted else ():
        layer.page_lse_shift = torch.rand(heads, generator=gen) + 0.5
    cache = TurboQuantCache(table, chunk_reads=chunk_reads)
    checked = []

    def check(layer_idx, q, k, v):
        layer = k.tq_layer
        t, n = q.shape[2], layer.length
        dense_k, dense_v = layer.read_dense()
        scaling = q.shape[-1] ** -0.5
        reads = layer.exact[0].shape[2] if chunk_reads == "exact" else recent
        want = dense_attention(q, dense_k, dense_v, layer.exact, None, scaling, reads,
                               layer.packed_logit_bias())
        got = attend(layer, q, scaling)
        assert torch.allclose(got, want, atol=2e-5), (layer_idx, t, n)
        if shifted and n - t >= 2 + recent:  # some row reads the pages: the shift must show
            unshifted = dense_attention(q, dense_k, dense_v, layer.exact, None, scaling, recent)
            assert not torch.allclose(got, unshifted, atol=1e-3)
        # the window holds the rows as computed (the step's, then the kept ones), not the pages'
        assert layer.exact[0].shape[2] == min(n - 2, t + recent - 1)
        assert not torch.allclose(layer.exact[0][:, :, -1], dense_k[:, :, -1].float())
        checked.append((t, n))

    with observe(check):
        for chunk in (ids[:, :20], ids[:, 20:21], ids[:, 21:22], ids[:, 22:30]):
            logits(model, chunk, cache)
    assert (20, 20) in checked and (1, 21) in checked and (8, 30) in checked


def test_the_recent_window_is_read_exact_and_counted_as_stored(model, gen):
    """With recent_tokens 4 a decode step attends to the last 4 positions as computed: dropping
    the pages' copy of them changes nothing, and the window's 3 kept rows are counted in fp16."""
    ids = torch.randint(4, 60, (1, 16), generator=gen)
    table = table_for(model, 2)
    table.recent_tokens = 4
    cache = TurboQuantCache(table)
    logits(model, ids[:, :15], cache)
    for layer in cache.layers:  # spoil the pages' copy of the last 3 packed positions
        k, v = layer.read_packed()
        noise = tuple(x[:, :, -3:] + 5.0 for x in (k, v))
        layer.pages.append(layer.block_table, *(x.transpose(1, 2).reshape(3, layer.num_kv_heads, -1)
                                                for x in noise),
                           torch.zeros(3, dtype=torch.int32), torch.arange(12, 15, dtype=torch.int32))
    spoiled = logits(model, ids[:, 15:], cache)
    clean = TurboQuantCache(table)
    logits(model, ids[:, :15], clean)
    assert torch.allclose(spoiled, logits(model, ids[:, 15:], clean), atol=1e-5)
    fewer = oblivious_table(fingerprint("llama", model.config), 2, 2)
    # 15 + 1 tokens: every one in the pages, 3 kept rows in fp16, measured from the tensors
    assert held_bytes(cache) == cache.stored_bytes() == table.cache_bytes(16)
    assert cache.layers[0].sinks[0].shape[2] == 0
    assert table.layer_cache_bytes(0, 16) - fewer.layer_cache_bytes(0, 16) == \
        3 * table.kv_heads * table.fp16_token_bytes()


@pytest.mark.parametrize("case,expected", [("none", True), ("causal", True), ("additive", True),
                                           ("padded", False), ("top_left", False)])
def test_plain_causal_masks_are_recognized(case, expected):
    from tq_trtllm.integrations.packed_attention import is_bottom_right_causal

    t, n = 3, 7
    causal = (torch.arange(n) <= torch.arange(t)[:, None] + (n - t))[None, None].expand(2, 1, t, n)
    masks = {
        "none": None,
        "causal": causal,
        "additive": torch.zeros(2, 1, t, n).masked_fill(~causal, float("-inf")),
        "padded": causal & (torch.arange(n) > 0),
        "top_left": (torch.arange(n) <= torch.arange(t)[:, None])[None, None].expand(2, 1, t, n),
    }
    assert is_bottom_right_causal(masks[case], t, n) is expected


@pytest.mark.parametrize("chunk_reads", ["cache", "exact"])
def test_padded_batches_attend_over_the_cache_read_back(model, gen, chunk_reads):
    """A left-padded batch cannot use the in-place path; it must match each sequence run alone,
    for a prompt and then a step of two tokens."""
    ids = torch.randint(4, 60, (2, 14), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    table = table_for(model, 4)
    padded, alone = (TurboQuantCache(table, chunk_reads=chunk_reads) for _ in range(2))
    with torch.inference_mode():
        positions = (mask.cumsum(-1) - 1).clamp_min(0)  # as generate() derives them
        for a, b in ((0, 12), (12, 14)):
            batch = model(input_ids=ids[:, a:b], attention_mask=mask[:, :b],
                          position_ids=positions[:, a:b], past_key_values=padded).logits
            one = model(input_ids=ids[1:, max(a, 3):b], past_key_values=alone).logits
            assert torch.allclose(batch[1, -1], one[0, -1], atol=1e-4)


def test_the_kernel_backend_is_refused_clearly_where_it_cannot_run(model, gen):
    cache = TurboQuantCache(table_for(model, 3), backend="kernels")
    with pytest.raises(TQError, match="kernel backend cannot run here"):
        logits(model, torch.randint(4, 60, (1, 4), generator=gen), cache)


def test_incremental_decoding_equals_one_prefill(model, gen):
    """Appending token by token gives the same cache contents as one prefill, when the prefill's
    rows read their own step through the cache as decode steps do."""
    ids = torch.randint(4, 60, (1, 24), generator=gen)
    table = table_for(model, 3, sinks=2)
    full = TurboQuantCache(table, chunk_reads="cache")
    logits(model, ids, full)
    step = TurboQuantCache(table, chunk_reads="cache")
    logits(model, ids[:, :10], step)
    for t in range(10, 24):
        with torch.inference_mode():
            model(input_ids=ids[:, t:t + 1], past_key_values=step, use_cache=True)
    for a, b in zip(full.layers, step.layers):
        ka, va = a.read_dense()
        kb, vb = b.read_dense()
        assert torch.allclose(ka, kb, atol=1e-6) and torch.allclose(va, vb, atol=1e-6)


def test_a_prompt_reads_its_own_tokens_exactly_and_later_steps_read_the_pages(model, gen):
    """chunk_reads "exact" (the default): a prompt's logits are those of attention without a cache
    (the pages are written, not read); the next step's differ from an fp16 cache's, since it reads
    the prompt through the pages. Under "cache" the prompt's logits differ already."""
    ids = torch.randint(4, 60, (1, 30), generator=gen)
    with torch.inference_mode():
        plain = model(input_ids=ids, use_cache=False).logits
    exact, cached = TurboQuantCache(table_for(model, 2)), TurboQuantCache(table_for(model, 2),
                                                                          chunk_reads="cache")
    fp16 = RoundtripCache("fp16", 2, 64)
    assert torch.allclose(logits(model, ids[:, :29], exact), plain[:, :29], atol=1e-5)
    assert not torch.allclose(logits(model, ids[:, :29], cached), plain[:, :29], atol=1e-2)
    logits(model, ids[:, :29], fp16)
    step, want = logits(model, ids[:, 29:], exact), logits(model, ids[:, 29:], fp16)
    assert torch.allclose(want, plain[:, 29:], atol=1e-3)
    assert not torch.allclose(step, want, atol=1e-2)


def test_an_unknown_chunk_rule_is_refused():
    with pytest.raises(TQError, match="chunk_reads 'all' is unknown"):
        TurboQuantCache(table_for(tiny_model(), 3), chunk_reads="all")
    with pytest.raises(TQError, match="chunk_reads 'all' is unknown"):
        RoundtripCache("fp8", 2, 64, chunk_reads="all")


def test_sink_tokens_are_exact(model, gen):
    ids = torch.randint(4, 60, (1, 12), generator=gen)
    seen = []
    table = table_for(model, 2, sinks=3)
    cache = TurboQuantCache(table)
    with observe(lambda layer, q, k, v: seen.append((layer, k))):
        logits(model, ids, cache)
    keys, _ = cache.layers[0].read_dense()
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
    # measured from what the cache holds: 14 tokens' slots in each layer's K and V pages (one
    # sink token kept exact, in fp16), per KV head
    assert held_bytes(cache) == cache.stored_bytes() == table.cache_bytes(cached)
    for layer in cache.layers:
        for pool, layout in zip(layer.pages.pools, layer.pages.layouts):
            filled = written_slots(pool, layout)
            assert int(filled.sum()) == 14 * table.kv_heads
            assert int(filled.any(dim=1).sum()) == table.kv_heads  # one 16-token page per head
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
    ref = logits(model, ids, RoundtripCache("fp16", 2, 64, chunk_reads="cache"))
    table = oblivious_table(fingerprint(family, config), 4, 4)
    out = logits(model, ids, TurboQuantCache(table, chunk_reads="cache"))
    assert ((out - ref).norm() / ref.norm()).item() < 1.5 * 0.0095**0.5


def test_sliding_window_models_are_refused():
    import transformers

    from tq_trtllm.models.registry import check_config, get_family

    config = transformers.MistralConfig(sliding_window=4096)
    with pytest.raises(TQError, match="sliding-window"):
        check_config(get_family("mistral"), config)


@pytest.mark.parametrize("where", ["sink", "packed"])
def test_nan_or_inf_activations_are_refused_before_anything_is_stored(model, where):
    """The kernels cannot refuse NaN or Inf (they would store a finite wrong vector) and the exact
    sinks would keep it, so the cache refuses it on entry, whatever the backend: a bad key in a
    sink position and a bad value in a packed one."""
    table = table_for(model, 3, sinks=2)
    cache = TurboQuantCache(table)
    k, v = torch.randn(2, 1, table.kv_heads, 4, table.head_dim)
    if where == "sink":
        k[0, 0, 1] = float("nan")
    else:
        v[0, 0, 3, 5] = float("inf")
    with pytest.raises(TQError, match="NaN or Inf"):
        cache.update(k, v, 0)
    assert cache.get_seq_length(0) == 0
