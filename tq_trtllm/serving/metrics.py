"""The model's own metrics, through the Python backend's metrics API (pb_utils.MetricFamily): they
appear on Triton's /metrics beside its own, labelled with the model's name."""

from __future__ import annotations

from .scheduler import Stats

# decode-step batch sizes: every size up to 64 (tq-serve's --max-active) has its own bucket, so
# the most sequences that ran at once over any window is exact (client.peak_batch), and a test can
# read how many steps carried fewer than 8 sequences
BATCH_BUCKETS = [float(n) for n in (*range(1, 65), 96, 128, 256)]

GAUGES = {
    "tq_kv_cache_bytes": "KV cache bytes in use: the cache format's bytes of every active sequence",
    "tq_kv_cache_reserved_bytes": "KV cache bytes reserved by admitted sequences (prompt plus max_tokens)",
    "tq_kv_cache_budget_bytes": "The KV cache byte budget that bounds admission",
    "tq_cached_tokens": "Tokens held in the KV cache over all active sequences",
    "tq_kv_bytes_per_token": "KV cache bytes per token (all layers, at 1,024 tokens)",
    "tq_kv_fp16_bytes_per_token": "What an FP16 cache holds per token (all layers)",
    "tq_active_sequences": "Sequences in the decode batch",
    "tq_waiting_sequences": "Requests waiting for KV cache pages",
    "tq_model_on_gpu": "1 where the model and its cache run on the GPU (the kernel library), 0 on the CPU",
}
COUNTERS = {
    "tq_decode_steps_total": "Batched decode steps run",
    "tq_decode_step_sequences_total": "Sequences summed over decode steps (divide by steps: mean batch)",
    "tq_admitted_total": "Requests admitted into the batch (their pages reserved)",
    "tq_waited_for_pages_total": "Requests held back at least once because the KV budget was full",
    "tq_queue_seconds_total": "Seconds from arrival to admission, summed over admitted requests",
}
# the Stats totals behind the counters that follow them (published as increments)
TOTALS = {"tq_admitted_total": "admitted", "tq_waited_for_pages_total": "waited_for_pages",
          "tq_queue_seconds_total": "queue_seconds"}


class ModelMetrics:
    def __init__(self, pb_utils, model: str, bytes_per_token: float, fp16_bytes_per_token: int,
                 budget: int, on_gpu: bool = False):
        family = pb_utils.MetricFamily
        labels = {"model": model}
        # a metric needs its family alive: keep every family for the model's lifetime
        self.families = {name: family(name=name, description=text, kind=family.GAUGE)
                         for name, text in GAUGES.items()}
        self.families |= {name: family(name=name, description=text, kind=family.COUNTER)
                          for name, text in COUNTERS.items()}
        self.families["tq_requests_total"] = family(
            name="tq_requests_total", description="Requests ended, by outcome", kind=family.COUNTER)
        self.families["tq_decode_batch_size"] = family(
            name="tq_decode_batch_size", description="Sequences per decode step", kind=family.HISTOGRAM)
        self.gauges = {name: self.families[name].Metric(labels=labels) for name in GAUGES}
        self.counters = {name: self.families[name].Metric(labels=labels) for name in COUNTERS}
        self.outcomes = {o: self.families["tq_requests_total"].Metric(labels={**labels, "outcome": o})
                         for o in ("finished", "cancelled", "failed")}
        self.batch = self.families["tq_decode_batch_size"].Metric(labels=labels, buckets=BATCH_BUCKETS)
        self.gauges["tq_kv_bytes_per_token"].set(bytes_per_token)
        self.gauges["tq_kv_fp16_bytes_per_token"].set(fp16_bytes_per_token)
        self.gauges["tq_kv_cache_budget_bytes"].set(budget)
        self.gauges["tq_model_on_gpu"].set(int(on_gpu))
        self.seen = {"finished": 0, "cancelled": 0, "failed": 0}
        self.totals = dict.fromkeys(TOTALS.values(), 0)

    def publish(self, s: Stats) -> None:
        g = self.gauges
        g["tq_kv_cache_bytes"].set(s.kv_bytes)
        g["tq_kv_cache_reserved_bytes"].set(s.reserved_bytes)
        g["tq_cached_tokens"].set(s.cached_tokens)
        g["tq_active_sequences"].set(s.active)
        g["tq_waiting_sequences"].set(s.waiting)
        for size in s.step_sizes:
            self.batch.observe(size)
        if s.step_sizes:
            self.counters["tq_decode_steps_total"].increment(len(s.step_sizes))
            self.counters["tq_decode_step_sequences_total"].increment(sum(s.step_sizes))
        for outcome, metric in self.outcomes.items():
            total = getattr(s, outcome)
            if total > self.seen[outcome]:
                metric.increment(total - self.seen[outcome])
                self.seen[outcome] = total
        for name, field in TOTALS.items():
            total = getattr(s, field)
            if total > self.totals[field]:
                self.counters[name].increment(total - self.totals[field])
                self.totals[field] = total
