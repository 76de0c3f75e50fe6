"""Continuous batching: one thread owns the model and runs one decode loop for every sequence.

Each loop turn drops cancelled requests, admits waiting ones in arrival order while their pages fit
the byte budget (each is prefilled alone on its own cache, then joins the batch), and runs one
decode step over all active sequences (rows.RowsCache: one forward, each row attending over its own
cache). A sequence that ends leaves at once and its cache is dropped, freeing its pages. Admission
reserves a request's worst case (prompt plus max_tokens) so an admitted sequence never runs out.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..core.errors import TQError
from .rows import RowsCache
from .runner import Runner
from .sequence import Params, TextStream, choose_token


@dataclass
class Request:
    ids: list[int]  # the prompt's token ids
    params: Params
    emit: Callable[[str | None, bool], None]  # (text piece or None, final); raises if the client left
    fail: Callable[[str], None]  # a final error response
    cancelled: Callable[[], bool] = lambda: False


@dataclass
class Sequence:
    request: Request
    need: int  # reserved bytes
    text: TextStream
    cache: object = None
    generator: torch.Generator | None = None
    next_token: int = -1
    generated: int = 0
    arrived: float = field(default_factory=time.monotonic)  # when submit queued it
    waited_for_pages: bool = False


@dataclass
class Stats:
    """What metrics.py publishes after every loop turn."""
    active: int = 0
    waiting: int = 0
    kv_bytes: int = 0
    reserved_bytes: int = 0
    cached_tokens: int = 0
    step_sizes: list[int] = field(default_factory=list)  # the batch of each decode step since last
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    admitted: int = 0
    waited_for_pages: int = 0  # requests held back at least once because the budget was full
    queue_seconds: float = 0.0  # from submit to admission, summed over admitted requests


class Scheduler:
    def __init__(self, runner: Runner, budget_bytes: int, max_active: int = 64,
                 on_stats: Callable[[Stats], None] | None = None):
        self.runner, self.budget, self.max_active = runner, budget_bytes, max_active
        self.on_stats = on_stats or (lambda stats: None)
        self.waiting: deque[Sequence] = deque()
        self.active: list[Sequence] = []
        self.reserved = 0
        self.cv = threading.Condition()
        self.stopping = False
        self.stats = Stats()
        self.thread = threading.Thread(target=self._run, name="tq-scheduler", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout)

    def check(self, prompt_tokens: int, params: Params) -> int:
        """The bytes the request reserves; TQError when it can never run."""
        total = prompt_tokens + params.max_tokens
        if total > self.runner.max_context:
            raise TQError(f"the prompt has {prompt_tokens} tokens; with max_tokens {params.max_tokens} "
                          f"that exceeds the model's context of {self.runner.max_context} tokens; "
                          "lower max_tokens or shorten the prompt")
        need = self.runner.bytes_for(total)
        if need > self.budget:
            raise TQError(f"the request needs {need:,} bytes of KV cache ({total} tokens), more than "
                          f"the model's whole budget of {self.budget:,} bytes; lower max_tokens or "
                          "serve with a larger --kv-cache-mib")
        return need

    def submit(self, request: Request) -> None:
        """Queue a request (TQError if it can never fit); its responses come from the loop."""
        need = self.check(len(request.ids), request.params)
        seq = Sequence(request, need, TextStream(self.runner.tokenizer, request.params.stop))
        with self.cv:
            self.waiting.append(seq)
            self.cv.notify()

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self.cv:
                    while not (self.stopping or self.waiting or self.active):
                        self.cv.wait(1.0)
                    if self.stopping:
                        break
                self._drop_cancelled()
                self._admit()
                if self.active:
                    self._decode_step()
                self._publish()
        for seq in [*self.active, *self.waiting]:
            self._fail(seq, "the server is shutting down")

    def _drop_cancelled(self) -> None:
        with self.cv:
            gone = [s for s in self.waiting if s.request.cancelled()]
            for seq in gone:
                self.waiting.remove(seq)
        gone += [s for s in self.active if s.request.cancelled()]
        for seq in gone:
            self._release(seq)
            self.stats.cancelled += 1

    def _admit(self) -> None:
        while len(self.active) < self.max_active:
            with self.cv:
                if not self.waiting:
                    return
                if self.reserved + self.waiting[0].need > self.budget:
                    for held in self.waiting:  # first come, first served: all wait for pages
                        if not held.waited_for_pages:
                            held.waited_for_pages = True
                            self.stats.waited_for_pages += 1
                    return
                seq = self.waiting.popleft()
                self.reserved += seq.need
            self.stats.admitted += 1
            self.stats.queue_seconds += time.monotonic() - seq.arrived
            self.active.append(seq)
            self._prefill(seq)

    def _prefill(self, seq: Sequence) -> None:
        params = seq.request.params
        if params.temperature > 0:
            seq.generator = torch.Generator(self.runner.device)
            if params.seed is None:
                seq.generator.seed()
            else:
                seq.generator.manual_seed(params.seed)
        seq.cache = self.runner.new_cache()
        ids = torch.tensor([seq.request.ids], device=self.runner.device)
        try:
            logits = self.runner.model(input_ids=ids, past_key_values=seq.cache, use_cache=True,
                                       logits_to_keep=1).logits[0, -1]
        except Exception as err:  # a bad state of one request must not stop the loop
            self._fail(seq, f"prefill failed: {type(err).__name__}: {err}")
            return
        self._advance(seq, logits)

    def _decode_step(self) -> None:
        rows = list(self.active)
        ids = torch.tensor([[s.next_token] for s in rows], device=self.runner.device)
        pos = torch.tensor([[s.cache.get_seq_length()] for s in rows], device=self.runner.device)
        try:
            logits = self.runner.model(input_ids=ids, position_ids=pos, use_cache=True,
                                       past_key_values=RowsCache([s.cache for s in rows],
                                                                 self.runner.num_layers)).logits[:, -1]
        except Exception as err:
            for seq in rows:
                self._fail(seq, f"decode step failed: {type(err).__name__}: {err}")
            return
        self.stats.step_sizes.append(len(rows))
        for seq, row in zip(rows, logits):
            self._advance(seq, row)

    def _advance(self, seq: Sequence, logits: torch.Tensor) -> None:
        """Take the next token from `logits`, send what can be sent, and end the sequence when its
        end-of-sequence token, a stop string or max_tokens is reached."""
        params = seq.request.params
        token = choose_token(logits, params, seq.generator)
        seq.generated += 1
        piece = "" if token in self.runner.eos else seq.text.push(token)
        done = token in self.runner.eos or seq.text.stopped or seq.generated >= params.max_tokens
        seq.next_token = token
        try:
            if done:
                rest = seq.text.flush()
                if params.stream:
                    seq.request.emit(piece + rest or None, True)
                else:
                    seq.request.emit(seq.text.text, True)
            elif params.stream and piece:
                seq.request.emit(piece, False)
        except Exception:  # the client is gone: its pages are freed now
            done = True
            self.stats.cancelled += 1
        else:
            self.stats.finished += done
        if done:
            self._release(seq)

    def _release(self, seq: Sequence) -> None:
        if seq in self.active:
            self.active.remove(seq)
            with self.cv:
                self.reserved -= seq.need
        seq.cache = None  # the pages go with the last reference

    def _fail(self, seq: Sequence, message: str) -> None:
        self._release(seq)
        self.stats.failed += 1
        try:
            seq.request.fail(message)
        except Exception:
            pass

    def _publish(self) -> None:
        s = self.stats
        with self.cv:
            s.waiting = len(self.waiting)
            s.reserved_bytes = self.reserved
        s.active = len(self.active)
        lengths = [seq.cache.get_seq_length() for seq in self.active if seq.cache is not None]
        s.cached_tokens = sum(lengths)
        s.kv_bytes = sum(self.runner.bytes_for(n) for n in lengths)
        self.on_stats(s)
        s.step_sizes = []

    def wait_idle(self, timeout: float) -> bool:
        """True once nothing is active or waiting (for tests and benchmarks in-process)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.active and not self.waiting:
                return True
            time.sleep(0.01)
        return False
