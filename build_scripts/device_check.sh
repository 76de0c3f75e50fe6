#!/usr/bin/env bash
# One call on the GPU machine: the GPU tests, then the benchmarks, logs under $OUT (or ./device_out).
# Usage: build_scripts/device_check.sh [tests|bench|all] (the library must already be built).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
what="${1:-all}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if [[ "$what" == tests || "$what" == all ]]; then
  python3 -m pytest tests/gpu -q -rs -x 2>&1 | tee "$OUT/tests.log" | tail -25
fi
if [[ "$what" == bench || "$what" == all ]]; then
  python3 -m tq_trtllm.cli.bench decode --json 2>&1 | tee "$OUT/bench_decode.jsonl"
  python3 -m tq_trtllm.cli.bench decode --bits 4 --sizes 1x131072,32x32768 --json 2>&1 | tee -a "$OUT/bench_decode.jsonl"
  python3 -m tq_trtllm.cli.bench decode --shape smollm2 --sizes 1x131072,32x32768 --json 2>&1 | tee -a "$OUT/bench_decode.jsonl"
  python3 -m tq_trtllm.cli.bench prefill --json 2>&1 | tee "$OUT/bench_prefill.jsonl"
fi
