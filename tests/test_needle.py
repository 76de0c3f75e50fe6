"""The passkey test's graded score: the key's teacher-forced log-probability after the prompt."""

import pytest
import torch

from hf_fixtures import WORDS, tiny_model, tiny_text, tiny_tokenizer
from tq_trtllm.eval.needle import ALL, graded_changes, key_log_prob, paired_changes
from tq_trtllm.eval.paired import mean_ci95

pytest.importorskip("transformers")


def test_key_log_prob_sums_the_key_tokens_log_probabilities_after_the_prompt():
    from transformers import DynamicCache

    model, tok = tiny_model(), tiny_tokenizer()
    ids = tok(tiny_text(40), return_tensors="pt", add_special_tokens=False)["input_ids"]
    key = f"{WORDS[3]} {WORDS[7]} {WORDS[11]}"
    with torch.inference_mode():
        got = key_log_prob(model, tok, ids, key, DynamicCache())
        key_ids = tok(" " + key, add_special_tokens=False)["input_ids"]
        assert len(key_ids) == 3
        log_probs = torch.log_softmax(model(torch.cat([ids, torch.tensor([key_ids])], 1)).logits[0], -1)
    # token i of the key is predicted at the position before it
    want = sum(log_probs[ids.shape[1] - 1 + i, t].item() for i, t in enumerate(key_ids))
    assert got == pytest.approx(want, abs=1e-4)
    assert got < 0


def test_graded_changes_are_the_mean_paired_difference_per_length():
    rows = [{"length": n, "key_log_prob": {"fp16": base, "q": base + d}}
            for n, base, d in [(64, -3.0, -0.5), (64, -1.0, -0.1), (64, -2.0, 0.3), (128, -4.0, -1.0)]]
    got = graded_changes(rows, "q")
    assert got[64]["mean"] == pytest.approx(-0.1)
    low, high = got[64]["ci95"]
    # t(0.975, 2) = 4.303; sd of (-0.5, -0.1, 0.3) = 0.4
    assert (high - low) / 2 == pytest.approx(4.3027 * 0.4 / 3 ** 0.5, rel=1e-4)
    assert got[128] == {"mean": pytest.approx(-1.0), "ci95": [pytest.approx(-1.0), pytest.approx(-1.0)]}
    assert got[ALL]["mean"] == pytest.approx((-0.5 - 0.1 + 0.3 - 1.0) / 4)
    assert mean_ci95([2.0]) == (2.0, 2.0, 2.0)


def test_paired_changes_count_the_split_prompts_and_sign_test_them():
    """lost: the reference finds the key and the cache does not; won: the reverse. Five lost and
    none won has two-sided sign-test p = 2 / 2^5; no split prompt, p = 1."""
    def row(length, ref_hit, hit):
        return {"length": length, "key": "7 7 7",
                "answers": {"fp16": "7 7 7" if ref_hit else "no", "q": "is 7 7 7" if hit else "8 8"}}
    rows = [row(64, True, False)] * 5 + [row(64, True, True), row(64, False, False)] + [row(128, True, True)]
    got = paired_changes(rows, "q")
    assert got[64] == {"lost": 5, "won": 0, "p": pytest.approx(2 / 2**5)}
    assert got[128] == {"lost": 0, "won": 0, "p": 1.0}
    assert got[ALL] == got[64]
    swapped = paired_changes(rows + [row(128, False, True)] * 5, "q")[ALL]
    assert (swapped["lost"], swapped["won"]) == (5, 5) and swapped["p"] == pytest.approx(1.0)
