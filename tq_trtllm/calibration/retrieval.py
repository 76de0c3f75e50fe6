"""Synthetic retrieval windows for the layer sensitivity (CalibrationOptions.retrieval_windows).

Perplexity windows of running text hardly exercise long-range copying, so the Fisher costs of
`sensitivity.py` under-price the layers whose heads retrieve a far-away token (passkey retrieval
then fails while perplexity moves little). A retrieval window is calibration text made to need
copying: a stretch of the calibration text repeated as filler, a sentence that states a
random five-digit number at a random depth, and at the end a question whose answer is that number.
Its wording is deliberately not the passkey evaluation's (tq_trtllm.eval.needle): no pass key,
different filler and question, numbers from their own generator.
"""

from __future__ import annotations

import random

import torch

from ..core.errors import TQError

NEEDLE = " Note this well: the magic number is {key}. The magic number is {key}. "
QUESTION = "\nQuestion: what is the magic number? Answer: the magic number is {key}."
FILLER_TOKENS = 80  # tokens of the calibration text repeated as filler


def retrieval_windows(tokenizer, text: str, length: int, count: int, seed: int = 0) -> torch.Tensor:
    """`count` windows of exactly `length` tokens, int64 [count, length]; each ends with the
    question and its answer, so the model's predictions of the number's digits are in the window."""
    if count <= 0:
        return torch.zeros(0, length, dtype=torch.int64)

    def enc(s: str) -> list[int]:
        return tokenizer(s, add_special_tokens=False)["input_ids"]

    ids = enc(text)
    if len(ids) < FILLER_TOKENS:
        raise TQError(f"retrieval windows need at least {FILLER_TOKENS} tokens of calibration text")
    rng = random.Random(1_000_003 + seed)  # never the evaluation's generator
    rows = []
    for _ in range(count):
        key = str(rng.randint(10000, 99999))
        start = rng.randrange(len(ids) - FILLER_TOKENS + 1)
        filler = ids[start:start + FILLER_TOKENS]
        needle, question = enc(NEEDLE.format(key=key)), enc(QUESTION.format(key=key))
        n_filler = length - len(needle) - len(question)
        if n_filler < 1:
            raise TQError(f"retrieval windows need more than {len(needle) + len(question)} tokens")
        body = (filler * (n_filler // len(filler) + 1))[:n_filler]
        cut = int(n_filler * rng.uniform(0.05, 0.95))
        rows.append(body[:cut] + needle + body[cut:] + question)
    return torch.tensor(rows, dtype=torch.int64)
