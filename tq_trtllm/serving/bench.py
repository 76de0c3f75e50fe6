"""tq-bench serve: throughput of a served engine and of its FP16-cache baseline model at the same
KV byte budget, at several numbers of concurrent streaming clients, over the real server (a
tritonserver started on free loopback ports for the run). Everything but the client-side times
comes from the model's own metrics: tokens (one per sequence per decode step, plus the one each
prefill produces, so a row needs no detokenizing), the mean and the most sequences that ran at
once, and the requests that waited for KV pages. The prompts have a fixed token count, so the
budget admits a known number of sequences of each cache (`admits`, from the byte accounting that
the scheduler's admission uses)."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from ..core.errors import TQError

PROMPTS = ["Once upon a time", "The three primary colors are", "Write a short poem about the sea.",
           "The history of Rome", "To make a cup of tea,", "In the beginning", "The best way to learn",
           "Dear Sir or Madam,"]
# words that pad a prompt to its token count (each one to a few tokens)
FILLER = ("the old town by the river had a market every morning where people sold bread fish "
          "apples cheese and cloth while children ran between the stalls and the bells of the "
          "church rang over the roofs").split()
SETTLE_S = 30.0  # for the model's last loop turn to reach /metrics after the last response


def budget_prompts(tokenizer, tokens: int) -> list[str]:
    """PROMPTS, each padded with FILLER words to exactly `tokens` tokens of `tokenizer` (as the
    server counts them)."""
    def count(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    prompts = []
    for start in PROMPTS:
        text, words = start, 0
        n = count(text)
        while n < tokens:
            for candidate in (f"{text} {FILLER[words % len(FILLER)]}", f"{text} a"):  # "a": one token
                m = count(candidate)
                if m <= tokens:
                    text, n = candidate, m
                    break
            words += 1
            if words > 8 * tokens:
                raise TQError(f"no prompt of exactly {tokens} tokens could be made; choose another "
                              "--prompt-tokens")
        if n != tokens:
            raise TQError(f"a prompt came out at {n} tokens, not {tokens}; choose another --prompt-tokens")
        prompts.append(text)
    return prompts


@dataclass
class ServeRow:
    bench: str
    model: str
    cache: str  # turboquant or fp16
    instance_kind: str  # KIND_GPU or KIND_CPU
    on_gpu: bool  # where the model and its cache ran (the model's tq_model_on_gpu)
    clients: int
    requests: int
    prompt_tokens: int
    max_tokens: int
    kv_cache_mib: int
    admits: int  # sequences of prompt_tokens + max_tokens that the budget holds at once
    tokens: int
    seconds: float
    tokens_per_s: float
    requests_per_s: float
    mean_batch: float  # sequences per decode step, the mean
    peak_batch: int  # the most sequences in one decode step: the most that ran at once
    waited_for_pages: int  # requests held back because the budget was full
    queue_mean_s: float  # arrival to admission
    ttft_mean_s: float
    latency_mean_s: float


@dataclass
class Case:
    model: str
    cache: str
    admits: int


def measure(served, case: Case, clients: int, requests_per_client: int, prompts: list[str],
            max_tokens: int, timeout: float = 600.0) -> dict:
    """`clients` threads, each a gRPC stream sending its requests one after another; the figures
    of ServeRow that the run measures."""
    from . import client

    model = case.model
    before = client.read_metrics(served["metrics"])
    ttft, latency, errors = [], [], []

    def one(index: int) -> None:
        stream = client.Stream(served["grpc"])
        try:
            for r in range(requests_per_client):
                start = time.monotonic()
                stream.send(model, prompts[(index + r) % len(prompts)], max_tokens)
                _, first = stream.collect(timeout)
                ttft.append(first)
                latency.append(time.monotonic() - start)
        except Exception as err:  # reported after the run
            errors.append(str(err))
        finally:
            stream.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    seconds = time.monotonic() - start
    if errors or any(t.is_alive() for t in threads):
        raise TQError(f"the benchmark's requests failed: {errors[:3] or 'timed out'}")
    requests = clients * requests_per_client

    def delta(name, **labels):
        return (client.metric(after, name, model=model, **labels)
                - client.metric(before, name, model=model, **labels))

    deadline = time.monotonic() + SETTLE_S
    while True:  # the last loop turn publishes after the last response went out
        after = client.read_metrics(served["metrics"])
        if delta("tq_requests_total") >= requests or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if delta("tq_requests_total", outcome="finished") < requests:
        raise TQError(f"{model}: {requests} requests sent, the model counts "
                      f"{delta('tq_requests_total', outcome='finished'):.0f} finished")
    steps, rows = delta("tq_decode_steps_total"), delta("tq_decode_step_sequences_total")
    admitted = delta("tq_admitted_total")
    tokens = int(rows) + requests
    return dict(clients=clients, requests=requests, tokens=tokens, seconds=round(seconds, 3),
                tokens_per_s=round(tokens / seconds, 2), requests_per_s=round(requests / seconds, 3),
                mean_batch=round(rows / steps, 2) if steps else 0.0,
                peak_batch=int(client.peak_batch(before, after, model)),
                waited_for_pages=int(delta("tq_waited_for_pages_total")),
                queue_mean_s=round(delta("tq_queue_seconds_total") / admitted, 3) if admitted else 0.0,
                ttft_mean_s=round(sum(ttft) / len(ttft), 3), latency_mean_s=round(sum(latency) / len(latency), 3),
                on_gpu=bool(client.metric(after, "tq_model_on_gpu", model=model)))


def plan_cases(engine: Path, entries, sequence_tokens: int, budget: int) -> list[Case]:
    """Each model with the number of `sequence_tokens`-long sequences its cache fits in `budget`."""
    from ..calibration.tables_io import load_table
    from ..engine import read_manifest, tables_path
    from .runner import cache_bytes

    table = load_table(tables_path(engine, read_manifest(engine)))
    return [Case(e.name, e.cache, budget // cache_bytes(table, e.cache, sequence_tokens)) for e in entries]


def run(engine: Path, client_counts: list[int], requests_per_client: int, max_tokens: int,
        prompt_tokens: int, kv_cache_mib: int, max_active: int, cpu_threads: int, baseline: bool,
        timeout: float) -> list[ServeRow]:
    from ..engine import read_manifest
    from ..models.checkpoint import load_tokenizer
    from . import launcher
    from .repository import default_instance_kind, write_repository

    engine = engine.resolve()
    prompts = budget_prompts(load_tokenizer(read_manifest(engine).get("checkpoint")), prompt_tokens)
    kind = default_instance_kind()
    with tempfile.TemporaryDirectory(prefix="tq-bench-serve-") as tmp:
        repo = Path(tmp) / "repo"
        entries = write_repository([engine], repo, kv_cache_mib << 20, instance_kind=kind,
                                   max_active=max_active, cpu_threads=cpu_threads)
        entries = [e for e in entries if baseline or e.cache == "turboquant"]
        cases = plan_cases(engine, entries, prompt_tokens + max_tokens, kv_cache_mib << 20)
        for case in cases:
            if case.admits == 0:
                raise TQError(f"--kv-cache-mib {kv_cache_mib} holds no sequence of {case.model} of "
                              f"{prompt_tokens + max_tokens} tokens (--prompt-tokens plus --max-tokens); "
                              "raise --kv-cache-mib or lower those")
        host = "127.0.0.1"
        ports = launcher.Ports(*(launcher.free_port(host) for _ in range(3)))
        proc = launcher.start_server(repo, ports, host, [c.model for c in cases],
                                     log=Path(tmp) / "server.log")
        try:
            launcher.wait_ready(proc, host, ports, timeout, [c.model for c in cases])
            served = {"grpc": f"{host}:{ports.grpc}", "metrics": f"http://{host}:{ports.metrics}/metrics"}
            rows = []
            for case in cases:
                for n in client_counts:
                    got = measure(served, case, n, requests_per_client, prompts, max_tokens, timeout)
                    rows.append(ServeRow(bench="serve", model=case.model, cache=case.cache,
                                         instance_kind=kind, prompt_tokens=prompt_tokens,
                                         max_tokens=max_tokens, kv_cache_mib=kv_cache_mib,
                                         admits=case.admits, **got))
            return rows
        finally:
            launcher.stop_server(proc)


@click.command(help="Throughput of an engine served by Triton (tq-serve's repository on a "
                    "tritonserver started for the run) at several numbers of concurrent streaming "
                    "clients, and of its FP16-cache baseline model at the same KV byte budget: "
                    "tokens/s, how many sequences ran at once, how many requests waited for pages. "
                    "The defaults size the budget for SmolLM2-135M so that the FP16 cache runs out "
                    "of pages between 32 and 64 streams (docs/SERVING.md#at-a-fixed-kv-budget).")
@click.option("--engine", "engine_dir", required=True, type=click.Path(exists=True, file_okay=False,
                                                                       path_type=Path))
@click.option("--clients", default="1,8,32,64", show_default=True, help="Comma-separated client counts.")
@click.option("--requests", "requests_per_client", type=click.IntRange(1), default=1, show_default=True,
              help="Requests each client sends, one after another.")
@click.option("--prompt-tokens", type=click.IntRange(8), default=120, show_default=True,
              help="Tokens of every prompt (padded to exactly this many).")
@click.option("--max-tokens", type=click.IntRange(1), default=8, show_default=True)
@click.option("--kv-cache-mib", type=click.IntRange(1), default=112, show_default=True,
              help="Each model's KV budget (the same for both caches).")
@click.option("--max-active", type=click.IntRange(1), default=64, show_default=True,
              help="Most sequences in one decode batch (tq-serve's --max-active).")
@click.option("--cpu-threads", type=click.IntRange(1), default=1, show_default=True)
@click.option("--baseline/--no-baseline", default=True, show_default=True,
              help="Also measure the FP16-cache baseline model.")
@click.option("--timeout", type=click.IntRange(1), default=900, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
def serve(engine_dir, clients, requests_per_client, prompt_tokens, max_tokens, kv_cache_mib, max_active,
          cpu_threads, baseline, timeout, as_json):
    from ..cli.common import clean_errors, comma_list

    counts = comma_list(clients, int, "client counts")
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"{clients!r}: give client counts of 1 or more", param_hint="--clients")
    rows = clean_errors(run)(engine_dir, counts, requests_per_client, max_tokens, prompt_tokens,
                             kv_cache_mib, max_active, cpu_threads, baseline, timeout)
    if as_json:
        from ..eval.run_record import run_metadata

        meta = run_metadata()
        for r in rows:
            click.echo(json.dumps({**asdict(r), **meta}))
        return
    click.echo(f"{'model':<16}{'clients':>8}{'admits':>7}{'peak':>6}{'mean':>7}{'waited':>7}"
               f"{'tokens':>7}{'tok/s':>8}{'queue s':>8}{'ttft s':>8}{'latency s':>10}")
    for r in rows:
        click.echo(f"{r.model:<16}{r.clients:>8}{r.admits:>7}{r.peak_batch:>6}{r.mean_batch:>7.2f}"
                   f"{r.waited_for_pages:>7}{r.tokens:>7}{r.tokens_per_s:>8.2f}{r.queue_mean_s:>8.3f}"
                   f"{r.ttft_mean_s:>8.3f}{r.latency_mean_s:>10.3f}")
    click.echo("(on_gpu: " + ", ".join(sorted({f"{r.model} {r.on_gpu}" for r in rows})) + ")")
