"""tq-bench serve: throughput of a served engine at several numbers of concurrent streaming
clients, against its FP16-cache baseline model, over the real server (a tritonserver started on
free loopback ports for the run). Tokens are counted by the model's own step metric (one token per
sequence per decode step, plus the one each prefill produces), so a row needs no tokenizer."""

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


@dataclass
class ServeRow:
    bench: str
    model: str
    clients: int
    requests: int
    max_tokens: int
    tokens: int
    seconds: float
    tokens_per_s: float
    requests_per_s: float
    mean_batch: float
    ttft_mean_s: float
    latency_mean_s: float


def measure(served, model: str, clients: int, requests_per_client: int, max_tokens: int,
            timeout: float = 600.0) -> ServeRow:
    """`clients` threads, each a gRPC stream sending its requests one after another."""
    from . import client

    before = client.read_metrics(served["metrics"])
    ttft, latency, errors = [], [], []

    def one(index: int) -> None:
        stream = client.Stream(served["grpc"])
        try:
            for r in range(requests_per_client):
                start = time.monotonic()
                stream.send(model, PROMPTS[(index + r) % len(PROMPTS)], max_tokens)
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
    after = client.read_metrics(served["metrics"])

    def delta(name):
        return client.metric(after, name, model=model) - client.metric(before, name, model=model)

    requests = clients * requests_per_client
    steps, rows = delta("tq_decode_steps_total"), delta("tq_decode_step_sequences_total")
    tokens = int(rows) + requests
    return ServeRow("serve", model, clients, requests, max_tokens, tokens, round(seconds, 3),
                    round(tokens / seconds, 2), round(requests / seconds, 3),
                    round(rows / steps, 2) if steps else 0.0, round(sum(ttft) / len(ttft), 3),
                    round(sum(latency) / len(latency), 3))


def run(engine: Path, client_counts: list[int], requests_per_client: int, max_tokens: int,
        kv_cache_mib: int, cpu_threads: int, baseline: bool, timeout: float) -> list[ServeRow]:
    from . import launcher
    from .repository import write_repository

    with tempfile.TemporaryDirectory(prefix="tq-bench-serve-") as tmp:
        repo = Path(tmp) / "repo"
        entries = write_repository([engine], repo, kv_cache_mib << 20, cpu_threads=cpu_threads)
        models = [e.name for e in entries if baseline or e.cache == "turboquant"]
        host = "127.0.0.1"
        ports = launcher.Ports(*(launcher.free_port(host) for _ in range(3)))
        proc = launcher.start_server(repo, ports, host, models, log=Path(tmp) / "server.log")
        try:
            launcher.wait_ready(proc, host, ports, timeout, models)
            served = {"grpc": f"{host}:{ports.grpc}", "metrics": f"http://{host}:{ports.metrics}/metrics"}
            return [measure(served, model, n, requests_per_client, max_tokens, timeout)
                    for model in models for n in client_counts]
        finally:
            launcher.stop_server(proc)


@click.command(help="Throughput of an engine served by Triton (tq-serve's repository on a "
                    "tritonserver started for the run) at several numbers of concurrent streaming "
                    "clients, and of its FP16-cache baseline model at the same KV byte budget.")
@click.option("--engine", "engine_dir", required=True, type=click.Path(exists=True, file_okay=False,
                                                                       path_type=Path))
@click.option("--clients", default="1,4,16", show_default=True, help="Comma-separated client counts.")
@click.option("--requests", "requests_per_client", type=click.IntRange(1), default=2, show_default=True,
              help="Requests each client sends, one after another.")
@click.option("--max-tokens", type=click.IntRange(1), default=32, show_default=True)
@click.option("--kv-cache-mib", type=click.IntRange(1), default=512, show_default=True)
@click.option("--cpu-threads", type=click.IntRange(1), default=1, show_default=True)
@click.option("--baseline/--no-baseline", default=True, show_default=True,
              help="Also measure the FP16-cache baseline model.")
@click.option("--timeout", type=click.IntRange(1), default=900, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
def serve(engine_dir, clients, requests_per_client, max_tokens, kv_cache_mib, cpu_threads, baseline,
          timeout, as_json):
    from ..cli.common import clean_errors, comma_list

    counts = comma_list(clients, int, "client counts")
    rows = clean_errors(run)(engine_dir, counts, requests_per_client, max_tokens, kv_cache_mib,
                             cpu_threads, baseline, timeout)
    if as_json:
        from ..eval.run_record import run_metadata

        meta = run_metadata()
        for r in rows:
            click.echo(json.dumps({**asdict(r), **meta}))
        return
    click.echo(f"{'model':<20}{'clients':>8}{'requests':>9}{'tokens':>8}{'s':>8}{'tok/s':>8}"
               f"{'req/s':>7}{'batch':>7}{'ttft s':>8}{'latency s':>10}")
    for r in rows:
        click.echo(f"{r.model:<20}{r.clients:>8}{r.requests:>9}{r.tokens:>8}{r.seconds:>8.2f}"
                   f"{r.tokens_per_s:>8.2f}{r.requests_per_s:>7.2f}{r.mean_batch:>7.2f}"
                   f"{r.ttft_mean_s:>8.3f}{r.latency_mean_s:>10.3f}")
