#!/usr/bin/env bash
# On the GPU machine: compute-sanitizer memcheck over representative GPU tests, then an ncu profile
# of the decode kernels at batch 1, context 131072; or (ncu-long) the split and merge passes at both
# long shapes of issue 3's targets; or (ncu-prefill) the prefill pass at 2,048 new tokens over
# 32,768; the last two with the calibrated tables' rotary mean (logs under $OUT or ./device_out).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
what="${1:-all}"
# ncu under a time limit ($1, seconds) with the sections every mode reads; the rest of the
# arguments add a mode's own sections, its kernel filter and the command to profile.
profile() {
  local limit="$1"; shift
  timeout "$limit" ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section LaunchStats --section InstructionStats "$@"
}
if [[ "$what" == memcheck || "$what" == all ]]; then
  timeout 300 compute-sanitizer --tool memcheck --target-processes all --print-limit 20 \
    python3 -m pytest -q -x tests/gpu/test_attention.py tests/gpu/test_quantize_append.py \
    -k "block_edges or ragged and d64-h9x3-k3.5 or prefill and float16 or non_finite_new_row or fused_append or bad_input or page_shift or (matches_reference and 128 and (3 or 2.5)) or k5v3 or k3.5v2 or k2.5v2" \
    2>&1 | tee "$OUT/memcheck.log" | tail -15
fi
if [[ "$what" == racecheck ]]; then  # shared-memory races in the prefill and chunk passes
  timeout 300 compute-sanitizer --tool racecheck --target-processes all --print-limit 20 \
    python3 -m pytest -q -x tests/gpu/test_attention.py -k "prefill and float16" \
    2>&1 | tee "$OUT/racecheck.log" | tail -8
fi
if [[ "$what" == ncu || "$what" == all ]]; then
  profile 240 --section MemoryWorkloadAnalysis --section SourceCounters \
    -k regex:attention_split --launch-skip 2 --launch-count 1 \
    python3 -m tq_trtllm.cli.bench decode --sizes 1x131072 --iters 1 2>&1 | tee "$OUT/ncu_decode.txt" | grep -v "^==PROF==" | tail -120
fi
if [[ "$what" == ncu-long ]]; then
  for size in 1x131072 32x32768; do
    profile 200 --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      -k regex:"attention_split|merge_kernel" --launch-skip 4 --launch-count 2 \
      python3 -m tq_trtllm.cli.bench decode --sizes "$size" --iters 1 --rotary-pairs 16 > "$OUT/ncu_$size.txt" 2>&1
    grep -E "_kernel<|Frequency|Duration|DRAM Throughput|Issue Slots|Warps Per Scheduler|No Eligible|Issued Instructions  " "$OUT/ncu_$size.txt"
  done
fi
if [[ "$what" == ncu-prefill ]]; then
  profile 300 --section ComputeWorkloadAnalysis --section SourceCounters \
    -k regex:prefill_kernel --launch-skip 1 --launch-count 1 \
    python3 -m tq_trtllm.cli.bench prefill --rotary-pairs 16 --iters 2 2>&1 | tee "$OUT/ncu_prefill.txt" | grep -v "^==PROF==" | tail -150
fi
