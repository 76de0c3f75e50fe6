"""Passkey retrieval: a five-digit key hidden at several depths of filler text; the model must
repeat it. Run with the fp16 cache and the quantized cache on the same prompts."""

from __future__ import annotations

import random

import torch

from ..core.errors import TQError
from ..integrations.attention import use_turboquant_attention
from .choices import DEPTHS
from .paired import mean_ci95, sign_test_p

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")
QUESTION = "\nWhat is the pass key? The pass key is"


def passkey_prompt(tokenizer, length: int, depth: float, key: str,
                   filler_ids: list[int] | None = None) -> torch.Tensor:
    """Token ids of about `length` tokens with the key sentence at relative `depth` of the filler;
    filler_ids: the filler's tokens (repeated as needed), by default FILLER's."""
    needle = f" The pass key is {key}. Remember it. {key} is the pass key. "
    fixed = len(tokenizer(needle + QUESTION, add_special_tokens=False)["input_ids"])
    if filler_ids is None:
        filler_ids = tokenizer(FILLER, add_special_tokens=False)["input_ids"]
    n_filler = max(0, length - fixed)
    filler = (filler_ids * (n_filler // len(filler_ids) + 1))[:n_filler]
    cut = int(len(filler) * depth)
    text = tokenizer.decode(filler[:cut]) + needle + tokenizer.decode(filler[cut:]) + QUESTION
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]


def check_length(length: int, max_context: int, new_tokens: int) -> None:
    if length + new_tokens > max_context:
        raise TQError(f"context length {length} plus {new_tokens} new tokens exceeds the model's "
                      f"limit of {max_context} tokens")


def key_log_prob(model, tokenizer, ids: torch.Tensor, key: str, cache) -> float:
    """The teacher-forced log-probability of " <key>" after the prompt `ids` [1, T], summed over
    its tokens, with `cache` serving the forward passes: a graded retrieval score, which moves with
    the cache's error where the generated answer flips only at a near tie. The prompt and the key's
    tokens are two steps, as in generation, so that the key's tokens read the prompt as an answer
    does (under chunk_reads "exact" one step would read the whole prompt exactly)."""
    key_ids = tokenizer(" " + key, add_special_tokens=False, return_tensors="pt")["input_ids"].to(ids.device)
    logits = [model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0]]
    if key_ids.shape[1] > 1:
        logits.append(model(input_ids=key_ids[:, :-1], past_key_values=cache, use_cache=True).logits[0])
    log_probs = torch.log_softmax(torch.cat(logits).float(), dim=-1)
    return log_probs.gather(-1, key_ids[0][:, None]).sum().item()


def passkey_accuracy(model, tokenizer, lengths, cache_factories: dict, seeds=(0,),
                     depths=DEPTHS, progress=None, corpus_ids: list[int] | None = None,
                     graded: bool = False, known: dict | None = None,
                     on_seed=None) -> tuple[dict, list[dict]]:
    """cache_factories: name -> zero-argument cache factory. Every seed draws its own keys (and
    filler stretches); every cache answers the same prompts. Returns (name -> {length: accuracy
    over all seeds}, one row per prompt: its seed, length, depth and key, and under "answers" each
    cache's generated text by name).

    corpus_ids: tokens of running text; each prompt's filler is then its own stretch of it (the
    row's filler_start), so the prompts of a length are not one filler with different keys, whose
    answers move together (docs/QUALITY.md#passkey-retrieval). None: FILLER repeated.
    graded: each row also holds every cache's key_log_prob (see there) under "key_log_prob".
    known: (seed, length, depth) -> a row of an earlier run of the same caches (needle_rows), taken
    instead of running that prompt again. on_seed(rows): called with each seed's newly run rows."""
    use_turboquant_attention(model)
    known = known or {}
    max_context = int(getattr(model.config, "max_position_embeddings", 2048))
    for length in lengths:
        check_length(length, max_context, 8)
        if corpus_ids is not None and len(corpus_ids) < length:
            raise TQError(f"the filler text has {len(corpus_ids)} tokens; {length}-token prompts "
                          "need at least as many")
    rows = []
    for seed in seeds:
        rng, filler_rng = random.Random(seed), random.Random(f"filler {seed}")
        fresh = []
        for length in lengths:
            trials = [{"seed": seed, "length": length, "depth": depth,
                       "key": str(rng.randint(10000, 99999))} for depth in depths]
            if corpus_ids is not None:
                for trial in trials:  # their own generator: the keys stay those of the default filler
                    trial["filler_start"] = filler_rng.randrange(len(corpus_ids) - length + 1)
            for trial in trials:
                old = known.get((seed, length, trial["depth"]))
                if old is not None:
                    if (old["key"], old.get("filler_start")) != (trial["key"], trial.get("filler_start")):
                        raise TQError(f"the earlier run's prompt for seed {seed}, {length} tokens, "
                                      f"depth {trial['depth']} is not this run's; it was written by "
                                      "another version of tq-eval needle")
                    trial.update(old)
                    if progress:
                        progress(len(cache_factories))
                    continue
                fresh.append(trial)
                start = trial.get("filler_start")
                ids = passkey_prompt(tokenizer, length, trial["depth"], trial["key"], None
                                     if start is None else corpus_ids[start:start + length]).to(model.device)
                _answer(model, tokenizer, ids, trial, cache_factories, graded, progress)
            rows += trials
        if on_seed and fresh:
            on_seed(fresh)
    results = {name: {length: _hit_rate([r for r in rows if r["length"] == length], name)
                      for length in lengths} for name in cache_factories}
    return results, rows


def _answer(model, tokenizer, ids: torch.Tensor, trial: dict, cache_factories: dict, graded: bool,
            progress) -> None:
    """Every cache's answer to the prompt `ids` (and with `graded` its key_log_prob) into `trial`."""
    trial["answers"] = {}
    if graded:
        trial["key_log_prob"] = {}
    for name, factory in cache_factories.items():  # the same prompt for every cache
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 past_key_values=factory(), max_new_tokens=8,
                                 do_sample=False, pad_token_id=tokenizer.eos_token_id)
            if graded:
                trial["key_log_prob"][name] = key_log_prob(model, tokenizer, ids, trial["key"], factory())
        trial["answers"][name] = tokenizer.decode(out[0, ids.shape[1]:])
        if progress:
            progress()


def _hit(row: dict, name: str) -> bool:
    """Whether cache `name`'s answer to the prompt holds its key."""
    return row["key"] in row["answers"][name]


def _hit_rate(rows: list[dict], name: str) -> float:
    return sum(_hit(r, name) for r in rows) / len(rows)


ALL = "all"  # the key of the summaries over the prompts of every length


def _by_length(rows: list[dict]) -> dict:
    """The prompts of each length, then all of them under ALL."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(r["length"], []).append(r)
    return {**groups, ALL: rows}


def paired_changes(rows: list[dict], name: str, reference: str = "fp16") -> dict:
    """Per length and over all (ALL): prompts that `name` gets wrong where `reference` gets them
    right (lost), the reverse (won), and the sign test's p-value of that split. The prompts are
    shared, so these counts, not the accuracies alone, say where a cache differs."""
    out = {}
    for length, group in _by_length(rows).items():
        lost = sum(_hit(r, reference) and not _hit(r, name) for r in group)
        won = sum(_hit(r, name) and not _hit(r, reference) for r in group)
        out[length] = {"lost": lost, "won": won, "p": sign_test_p(lost, won)}
    return out


def graded_changes(rows: list[dict], name: str, reference: str = "fp16") -> dict:
    """Per length and over all (ALL): the mean change of the key's log-probability against
    `reference` over the prompts (nats), with a 95% t-interval."""
    out = {}
    for length, group in _by_length(rows).items():
        mean, low, high = mean_ci95([r["key_log_prob"][name] - r["key_log_prob"][reference] for r in group])
        out[length] = {"mean": mean, "ci95": [low, high]}
    return out
