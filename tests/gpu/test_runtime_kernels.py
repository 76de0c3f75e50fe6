"""The transformers runtime on the kernels: a tiny random Llama on the GPU, its TurboQuantCache
appended and read by libtq_kernels, against the same cache on the Python reference backend."""

import pytest
import torch

pytest.importorskip("transformers")

from hf_fixtures import tiny_model  # noqa: E402
from tq_trtllm.calibration.table import oblivious_table  # noqa: E402
from tq_trtllm.core.rotary_mean import select_pairs  # noqa: E402
from tq_trtllm.integrations.attention import use_turboquant_attention  # noqa: E402
from tq_trtllm.integrations.cache import TurboQuantCache  # noqa: E402
from tq_trtllm.models.fingerprint import fingerprint  # noqa: E402
from tq_trtllm.models.registry import rotary_frequencies  # noqa: E402

# a prefill whose first rows see sinks only, decode steps (decode kernel), a chunk of 3 (decode
# kernel, q_len 3) and one of 12 (prefill kernel) over the history
CHUNKS = ((0, 20), (20, 21), (21, 22), (22, 25), (25, 37))


@pytest.fixture(scope="module", params=[torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def model(request):
    # One layer: its keys and values come from the embeddings, so both backends cache the same
    # inputs (deeper layers' inputs differ by the attentions' rounding, and a code flips wherever a
    # coordinate moves across a decision boundary).
    m = tiny_model(layers=1).to("cuda", request.param)
    use_turboquant_attention(m)
    return m


def run(model, ids, backend, bits, sinks, recent=1, shifted=False, rotary=False, chunk_reads="cache"):
    table = oblivious_table(fingerprint("llama", model.config), bits, bits)
    table.sink_tokens = sinks
    table.recent_tokens = recent
    if shifted:  # the kernels take the pages' shift through the kernel cache, the reference in Python
        for i, layer in enumerate(table.layers):
            layer.page_lse_shift = torch.linspace(0.2, 1.0, model.config.num_attention_heads) + i
    if rotary:  # a rotary key mean on the model's own RoPE frequencies
        gen = torch.Generator().manual_seed(5)
        for layer in table.layers:
            pre = 2.0 * torch.randn(table.kv_heads, table.head_dim, generator=gen, dtype=torch.float64)
            layer.key_rotary = select_pairs(pre, rotary_frequencies(model), 16, offset=sinks)
    cache = TurboQuantCache(table, backend=backend, chunk_reads=chunk_reads)
    outs = []
    with torch.inference_mode():
        for a, b in CHUNKS:
            outs.append(model(input_ids=ids[:, a:b], past_key_values=cache, use_cache=True).logits)
    return torch.cat(outs, dim=1).float(), cache


# chunk_reads "exact": the chunks' rows read the pages as one-token sequences over copies of the
# block table (integrations.backends.KernelBackend.attend)
@pytest.mark.parametrize("bits,sinks,recent,shifted,rotary,chunk_reads", [
    (3, 0, 1, False, False, "cache"), (3, 2, 1, False, False, "cache"), (4, 1, 1, False, False, "cache"),
    (2.5, 1, 1, False, False, "cache"), (3, 1, 4, False, False, "cache"), (3, 0, 16, False, False, "cache"),
    (3, 1, 4, True, False, "cache"), (3, 2, 4, True, True, "cache"), (3, 0, 1, False, False, "exact"),
    (3, 2, 4, True, True, "exact")])
def test_kernel_backend_matches_the_reference_backend(model, bits, sinks, recent, shifted, rotary,
                                                      chunk_reads):
    gen = torch.Generator().manual_seed(int(10 * bits) + sinks)
    ids = torch.randint(4, 60, (2, 37), generator=gen).cuda()
    got, kc = run(model, ids, "kernels", bits, sinks, recent, shifted, rotary, chunk_reads)
    want, rc = run(model, ids, "reference", bits, sinks, recent, shifted, rotary, chunk_reads)
    assert kc.layers[0].uses_kernels and not rc.layers[0].uses_kernels
    assert torch.isfinite(got).all()
    # the same cache contents: codes equal but on decision boundaries and where fp32 and float64
    # pick different scales of step 4.4's search on a near tie (rare), gains within an fp16 ulp
    for x, y in zip(kc.layers[0].read_dense(), rc.layers[0].read_dense()):
        rel = (x - y).float().norm(dim=-1) / y.float().norm(dim=-1).clamp_min(1e-6)
        assert (rel < 2e-3).float().mean().item() >= 0.98, f"{(rel >= 2e-3).sum()} vectors differ"
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 1e-2, f"logits differ by {rel:.3g} (relative)"
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.95


def test_generate_runs_on_the_kernels(model):
    table = oblivious_table(fingerprint("llama", model.config), 3, 3)
    table.sink_tokens = 1
    cache = TurboQuantCache(table, backend="kernels")
    ids = torch.randint(4, 60, (1, 40), generator=torch.Generator().manual_seed(3)).cuda()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                             max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=2)
    assert out.shape[1] == 64
    assert cache.get_seq_length() == 63
    assert cache.stored_bytes() == table.cache_bytes(63)
