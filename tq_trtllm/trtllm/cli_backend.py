"""--backend for tq-run and tq-eval ppl|needle: 'hf' runs the command as it is, 'trtllm' hands its
arguments to this package's implementation (through TensorRT-LLM's ModelRunnerCpp)."""

from __future__ import annotations

import functools
import json

import click

from ..core.errors import TQError

BACKENDS = ("hf", "trtllm")


def backend_option(trtllm_impl):
    """Decorator: adds --backend; with 'trtllm' calls trtllm_impl(**the command's arguments)
    instead of the command (the command's own signature stays as it is)."""
    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if kwargs.pop("backend") == "trtllm":
                try:
                    return trtllm_impl(**kwargs)
                except TQError as err:
                    raise click.ClickException(str(err)) from None
            return func(*args, **kwargs)
        return click.option("--backend", type=click.Choice(BACKENDS), default="hf", show_default=True,
                            help="hf: transformers with the Python/kernel cache; trtllm: an engine built "
                                 "with tq-build --backend trtllm, through TensorRT-LLM's ModelRunnerCpp "
                                 "(docs/TRTLLM.md).")(wrapper)
    return decorate


def _refuse(**given) -> None:
    for flag, value in given.items():
        if value:
            raise TQError(f"{flag} is not available with --backend trtllm; run it with --backend hf")


def run_trtllm(engine_dir, prompt, max_new_tokens, chat, device, as_json, **_):
    from .runner import run_prompt

    if not prompt.strip():
        raise TQError("the prompt is empty")
    result = run_prompt(engine_dir, prompt, max_new_tokens, chat)
    if result is None:  # another MPI rank
        return
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(result["text"])
    click.echo(f"\nKV pool: {result['kv_bytes']:,} bytes for {result['cached_tokens']} tokens; an FP16 pool "
               f"would hold {result['kv_bytes_fp16']:,} bytes "
               f"({result['kv_bytes_fp16'] / max(result['kv_bytes'], 1):.2f}x larger)")


def ppl_trtllm(engines, baselines, corpus, max_tokens, window, as_json, device, **_):
    """Perplexity of one TensorRT-LLM engine against the model in FP16 (transformers, no cache
    quantization), on the same windows; the engine's side teacher-forced one generation step per
    token, so that every earlier position is read from the packed pool."""
    import torch

    from ..calibration.capture import token_windows
    from ..eval.corpus import read_corpus
    from ..eval.paired import mean_ci95
    from ..models.checkpoint import load_model
    from .runner import FORCING, TeacherForcing, open_engine, window_nll

    _refuse(**{"--baseline": baselines})
    if len(engines) != 1:
        raise TQError("--backend trtllm measures one --engine at a time")
    forcing = TeacherForcing()
    opened = open_engine(engines[0], logits_processors={FORCING: forcing}, what="tq-eval ppl --backend trtllm")
    if opened.rank != 0:  # the other ranks' executors serve rank 0's requests until it shuts down
        return
    if window > opened.manifest["trtllm"]["max_seq_len"]:
        raise TQError(f"--window {window} exceeds the engine's --max-seq-len {opened.manifest['trtllm']['max_seq_len']}")
    text, source = read_corpus(corpus)
    windows = token_windows(opened.tokenizer, text, window, max_tokens // window)
    loaded = load_model(opened.manifest["model"], opened.manifest.get("checkpoint"))
    model = loaded.model.to("cuda", torch.bfloat16)
    base, quant, agree = [], [], []
    for ids in windows:
        with torch.inference_mode():
            logits = model(input_ids=ids[None].cuda()).logits[0, :-1].float()
        base.append(torch.nn.functional.cross_entropy(logits, ids[1:].cuda()).item())
        nll, top = window_nll(opened, forcing, ids.tolist())
        quant.append(nll)
        agree.append(sum(int(a == b) for a, b in zip(top, logits.argmax(-1).tolist())) / len(top))
    import math

    mean, low, high = mean_ci95([q - b for q, b in zip(quant, base)])
    result = {"method": opened.path.name, "backend": "trtllm", "corpus": source,
              "ppl_fp16": math.exp(sum(base) / len(base)), "ppl_kv": math.exp(sum(quant) / len(quant)),
              "delta_pct": 100 * (math.exp(mean) - 1),
              "delta_ci95_pct": [100 * (math.exp(low) - 1), 100 * (math.exp(high) - 1)],
              "top1_agreement": sum(agree) / len(agree), "windows": len(base), "window_tokens": window}
    if as_json:
        click.echo(json.dumps(result))
        return
    lo, hi = result["delta_ci95_pct"]
    click.echo(f"{result['method']:>24}: ppl {result['ppl_kv']:.4f} vs fp16 {result['ppl_fp16']:.4f}  delta "
               f"{result['delta_pct']:+.2f}% [95% CI {lo:+.2f}, {hi:+.2f}]  top-1 {100 * result['top1_agreement']:.2f}%"
               f"  ({result['windows']} x {window} tokens, TensorRT-LLM)")


def needle_trtllm(engines, lengths, seeds, depths, filler, baselines, graded, rows_file, chunk_reads,
                  as_json, device, **_):
    """Passkey retrieval through the engine: the prompt prefilled, the answer generated greedily
    (8 tokens) by the runtime, each answer token reading the prompt from the packed pool."""
    import random

    from ..cli.common import token_lengths
    from ..eval.corpus import read_corpus
    from ..eval.needle import check_length, passkey_prompt
    from .runner import generate, open_engine

    _refuse(**{"--baseline": baselines, "--graded": graded, "--rows": rows_file})
    if chunk_reads != "exact":
        raise TQError("--backend trtllm reads a prompt's own tokens as computed (--chunk-reads exact): the "
                      "plugin's context phase")
    if len(engines) != 1:
        raise TQError("--backend trtllm measures one --engine at a time")
    from ..cli.eval_ppl_needle import _depths, _seeds

    lengths, seeds, depths = token_lengths(lengths), _seeds(seeds), _depths(depths)
    opened = open_engine(engines[0], what="tq-eval needle --backend trtllm")
    if opened.rank != 0:  # the other ranks' executors serve rank 0's requests until it shuts down
        return
    for n in lengths:
        check_length(n, opened.manifest["trtllm"]["max_seq_len"], 8)
    corpus_ids = None
    if filler is not None:
        corpus_ids = opened.tokenizer(read_corpus(filler)[0], add_special_tokens=False)["input_ids"]
    hits = {n: [] for n in lengths}
    for seed in seeds:
        rng, filler_rng = random.Random(seed), random.Random(f"filler {seed}")
        for n in lengths:  # the same keys and filler stretches as eval.needle.passkey_accuracy's
            keys = [str(rng.randint(10000, 99999)) for _ in depths]
            starts = [filler_rng.randrange(len(corpus_ids) - n + 1) if corpus_ids is not None else None
                      for _ in depths]
            for depth, key, start in zip(depths, keys, starts):
                ids = passkey_prompt(opened.tokenizer, n, depth, key,
                                     None if start is None else corpus_ids[start:start + n])[0].tolist()
                answer = opened.tokenizer.decode(generate(opened, ids, 8)["ids"])
                hits[n].append(key in answer)
    accuracy = {n: sum(h) / len(h) for n, h in hits.items()}
    if as_json:
        click.echo(json.dumps({"backend": "trtllm", "engine": opened.path.name, "lengths": lengths,
                               "seeds": seeds, "depths": depths, "accuracy": accuracy}))
        return
    for n in lengths:
        click.echo(f"{n:>6} tokens: passkey retrieval {accuracy[n]:.2f} ({len(hits[n])} prompts, TensorRT-LLM)")
