#!/usr/bin/env bash
# One call on the GPU machine: the GPU tests, then the benchmarks, logs under $OUT (or ./device_out).
# Usage: build_scripts/device_check.sh [stage|tests|bench|all] (after build_scripts/device_bench_prep.sh
# here; `stage` unpacks FlashInfer and JIT-compiles its FP8 decode, the others need the library).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
what="${1:-all}"
if [[ "$what" == stage ]]; then  # FlashInfer's FP8 decode modules compiled once, on a small case
  python3 -c "
from tq_trtllm.eval.fp8_baseline import flashinfer_missing, fp8_decode_calls
assert flashinfer_missing() is None, flashinfer_missing()
for call in fp8_decode_calls(2, 1000, 32, 8, 128).values():
    call()
print('flashinfer FP8 decode: compiled and ran')" 2>&1 | tee "$OUT/stage.log" | tail -5
  exit
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if [[ "$what" == compare ]]; then
  # The built library against the previous one (device_verify_prep.sh), alternating, in one call
  # (the previous library must have the same C ABI version: the binding refuses another):
  # ROUNDS rounds of decode at the issue's five shapes and prefill, 3 and 4 bits.
  for round in $(seq "${ROUNDS:-2}"); do
    for lib in "$TQ_STAGE/old/libtq_kernels.so" build/plugin_cpp/kernels/libtq_kernels.so; do
      tag=$([[ $lib == *old* ]] && echo old || echo new)
      TQ_KERNELS_LIB=$lib python3 -m tq_trtllm.cli.bench decode --bits 3,4 --rotary-pairs 16 --json 2>&1 \
        | sed "s/^{/{\"library\": \"$tag\", \"round\": $round, /" | tee -a "$OUT/compare_decode.jsonl" | cut -c1-160
      TQ_KERNELS_LIB=$lib python3 -m tq_trtllm.cli.bench prefill --bits 3,4 --rotary-pairs 16 --json 2>&1 \
        | sed "s/^{/{\"library\": \"$tag\", \"round\": $round, /" | tee -a "$OUT/compare_prefill.jsonl" | cut -c1-160
    done
  done
  exit
fi
if [[ "$what" == tests || "$what" == all ]]; then
  python3 -m pytest tests/gpu -q -rs -x 2>&1 | tee "$OUT/tests.log" | tail -25
fi
if [[ "$what" == bench || "$what" == all ]]; then
  # Llama-3-8B's attention shape, 3 and 4 bits with the calibrated tables' rotary mean; the FP8
  # column where FlashInfer is staged (build_scripts/device_bench_prep.sh)
  python3 -m tq_trtllm.cli.bench decode --bits 3,4 --rotary-pairs 16 --json 2>&1 | tee "$OUT/bench_decode.jsonl"
  python3 -m tq_trtllm.cli.bench prefill --bits 3,4 --rotary-pairs 16 --json 2>&1 | tee "$OUT/bench_prefill.jsonl"
fi
