"""Clients of a served model, over the real protocols: Triton's generate extension (HTTP JSON) and
gRPC streaming through tritonclient; and the model's metrics read from /metrics. tq-bench serve and
the tests use them."""

from __future__ import annotations

import json
import queue
import re
import time
import urllib.error
import urllib.request

import numpy as np

from ..core.errors import TQError


def generate(base_url: str, model: str, body: dict, timeout: float = 120.0) -> tuple[int, dict]:
    """POST /v2/models/MODEL/generate: (HTTP status, JSON reply)."""
    request = urllib.request.Request(f"{base_url}/v2/models/{model}/generate", method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def generate_stream(base_url: str, model: str, body: dict, timeout: float = 120.0) -> list[dict]:
    """POST /v2/models/MODEL/generate_stream: the server-sent events' JSON objects."""
    request = urllib.request.Request(f"{base_url}/v2/models/{model}/generate_stream", method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return [json.loads(line[5:]) for line in reply.read().decode().splitlines()
                if line.startswith("data:")]


def _inputs(grpcclient, prompt: str, max_tokens: int, stream: bool, extra: dict):
    """The request's tensors; `extra` adds inputs or replaces these (numpy arrays)."""
    values = {"text_input": np.array([prompt.encode()], dtype=object),
              "max_tokens": np.array([max_tokens], dtype=np.int32),
              "stream": np.array([stream])}
    values.update(extra)
    inputs = []
    for name, value in values.items():
        dtype = "BYTES" if value.dtype == object else {np.dtype(np.int32): "INT32",
                                                        np.dtype(np.bool_): "BOOL",
                                                        np.dtype(np.float32): "FP32",
                                                        np.dtype(np.uint64): "UINT64"}[value.dtype]
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


class Stream:
    """One gRPC stream to a model: send a request, then read its pieces as they come."""

    def __init__(self, address: str):
        import tritonclient.grpc as grpcclient

        self.grpcclient = grpcclient
        self.client = grpcclient.InferenceServerClient(address)
        self.replies: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.replies.put((result, error)))

    def send(self, model: str, prompt: str, max_tokens: int, stream: bool = True,
             extra: dict | None = None) -> None:
        self.client.async_stream_infer(model, _inputs(self.grpcclient, prompt, max_tokens, stream,
                                                      extra or {}),
                                       enable_empty_final_response=True)

    def next(self, timeout: float) -> tuple[str | None, bool]:
        """The next reply: (its text or None, whether it is the final one); TQError on an error."""
        result, error = self.replies.get(timeout=timeout)
        if error is not None:
            raise TQError(str(error))
        final = result.get_response().parameters["triton_final_response"].bool_param
        out = result.as_numpy("text_output")
        return (None if out is None else out.reshape(-1)[0].decode()), final

    def collect(self, timeout: float) -> tuple[list[str], float]:
        """Every piece until the final reply, and the seconds to the first piece."""
        start, first, pieces = time.monotonic(), None, []
        deadline = start + timeout
        while True:
            text, final = self.next(max(0.01, deadline - time.monotonic()))
            if text is not None:
                pieces.append(text)
                first = first if first is not None else time.monotonic() - start
            if final:
                return pieces, first if first is not None else time.monotonic() - start

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def stream_text(address: str, model: str, prompt: str, max_tokens: int, timeout: float = 120.0) -> str:
    s = Stream(address)
    try:
        s.send(model, prompt, max_tokens)
        return "".join(s.collect(timeout)[0])
    finally:
        s.close()


_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')


def read_metrics(metrics_url: str, timeout: float = 10.0) -> list[tuple[str, dict, float]]:
    """Every sample of Prometheus' text format at metrics_url: (name, labels, value)."""
    with urllib.request.urlopen(metrics_url, timeout=timeout) as reply:
        text = reply.read().decode()
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
            samples.append((match.group(1), labels, float(match.group(3))))
    return samples


def metric(samples, name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == str(x) for k, x in labels.items()))


def peak_batch(before, after, model: str, histogram: str = "tq_decode_batch_size") -> float:
    """The most sequences one decode step carried between two readings of /metrics: the smallest
    bucket bound holding every step observed in between (exact where each size has its own bucket,
    metrics.BATCH_BUCKETS); 0 when no step ran."""
    def buckets(samples):  # {bound: cumulative count}
        return {float(lab["le"]): v for n, lab, v in samples
                if n == f"{histogram}_bucket" and lab.get("model") == model}

    steps = metric(after, f"{histogram}_count", model=model) - metric(before, f"{histogram}_count", model=model)
    if steps <= 0:
        return 0.0
    old, new = buckets(before), buckets(after)
    return min((b for b in new if new[b] - old.get(b, 0.0) >= steps), default=float("inf"))
