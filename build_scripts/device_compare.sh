#!/usr/bin/env bash
# Two libraries of different C ABI versions, each under its own package, in ONE call on the GPU
# machine (docs/BENCHMARKS.md#speed-by-revision): the binding refuses a library of another ABI, so
# each side runs from a snapshot of the package at its revision. Here, before the calls:
#   mkdir -p device_carry/cmp_old device_carry/cmp_new
#   git archive REV tq_trtllm tests build_scripts plugin_cpp/kernels/bench pyproject.toml | xz > device_carry/cmp_X/pkg.tar.xz
#   xz -c THAT_REVISIONS_LIBRARY > device_carry/cmp_X/libtq_kernels.so.xz; echo REV > device_carry/cmp_X/REVISION
#   (the new side may add its plugin and harness: build/plugin_cpp/plugin/{libtq_attention_plugin.so,
#   tq_plugin_harness} as device_carry/cmp_new/plugin/*.xz, for tests/gpu's plugin tests)
# (a call carries at most 64 MiB: one side per call). On the GPU machine, back to back (the stage
# lives in /tmp while the machine stays warm):
#   bash build_scripts/device_compare.sh stage old|new      carry device_carry/cmp_old or cmp_new
#   bash build_scripts/device_compare.sh bench [ROUNDS]     old, new, old, new, ...: decode + prefill
#   bash build_scripts/device_compare.sh tests|racecheck|memcheck|floor   the new side alone
#   (tests: tests/gpu and, where device_carry/cmp_new/tq_decode_step.xz was staged, the C++ example)
# Logs and rows under $OUT (default ./device_out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-device_out}"; mkdir -p "$OUT"
stage=/tmp/tq_cmp
export PYTHONUNBUFFERED=1 TQ_REQUIRE_GPU=1
# Run a command under one side's package, library and revision.
side() {
  local which=$1; shift
  (cd "$stage/$which/pkg" && PYTHONPATH=. TQ_KERNELS_LIB="$stage/$which/libtq_kernels.so" \
     TQ_PLUGIN_BUILD_DIR="$stage/$which/plugin" LD_LIBRARY_PATH="$stage/$which:${LD_LIBRARY_PATH:-}" \
     TQ_REVISION="$(cat "$stage/$which/REVISION")" "$@")
}
case "${1:-}" in
  stage)
    [[ ${2:-} == old || ${2:-} == new ]] || { echo "usage: $0 stage old|new" >&2; exit 2; }
    rm -rf "${stage:?}/$2"; mkdir -p "$stage/$2/pkg"
    xz -T8 -dc "device_carry/cmp_$2/libtq_kernels.so.xz" > "$stage/$2/libtq_kernels.so"
    xz -T8 -dc "device_carry/cmp_$2/pkg.tar.xz" | tar xf - -C "$stage/$2/pkg"
    cp "device_carry/cmp_$2/REVISION" "$stage/$2/REVISION"
    mkdir -p "$stage/$2/plugin"
    for f in "device_carry/cmp_$2"/plugin/*.xz; do
      [[ -f $f ]] || continue
      xz -dc "$f" > "$stage/$2/plugin/$(basename "${f%.xz}")"; chmod +x "$stage/$2/plugin/$(basename "${f%.xz}")"
    done
    if [[ -f device_carry/cmp_$2/tq_decode_step.xz ]]; then
      xz -dc "device_carry/cmp_$2/tq_decode_step.xz" > "$stage/$2/tq_decode_step"; chmod +x "$stage/$2/tq_decode_step"
    fi
    echo "staged $2: $(cat "$stage/$2/REVISION")"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader ;;
  bench)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
    for round in $(seq "${2:-2}"); do
      for which in old new; do
        for pass in decode prefill; do
          side "$which" python3 -m tq_trtllm.cli.bench "$pass" --bits 3,4 --rotary-pairs 16 --json 2>&1 \
            | sed "s/^{/{\"library\": \"$which\", \"round\": $round, /" \
            | tee -a "$OUT/compare_$pass.jsonl" | cut -c1-150
        done
      done
    done ;;
  tests)  # tests/gpu (the plugin's with the staged plugin and harness), then the C++ example
    side new python3 -m pytest tests/gpu -q -rs 2>&1 | tee "$OUT/tests.log" | tail -15
    for n in 1 4096 131072; do side new "$stage/new/tq_decode_step" "$n" 2>&1 | tail -2; done \
      | tee "$OUT/decode_step.log" ;;
  memcheck)
    side new timeout 400 compute-sanitizer --tool memcheck --target-processes all --print-limit 20 \
      python3 -m pytest -q -x tests/gpu/test_attention.py tests/gpu/test_quantize_append.py \
      -k "block_edges or prefill and float16 or fused_append or bad_input or page_shift or k3.5v2" \
      2>&1 | tee "$OUT/memcheck.log" | tail -6 ;;
  racecheck)  # shared-memory races in the prefill pass
    side new timeout 400 compute-sanitizer --tool racecheck --target-processes all --print-limit 20 \
      python3 -m pytest -q -x tests/gpu/test_attention.py -k "prefill and float16" \
      2>&1 | tee "$OUT/racecheck.log" | tail -8 ;;
  floor)  # the working tree's floor kernel and script under the new side's package
    cp plugin_cpp/kernels/bench/fixed_cost_floor.cu "$stage/new/pkg/plugin_cpp/kernels/bench/"
    cp build_scripts/fixed_cost_floor.py "$stage/new/pkg/build_scripts/"
    side new python3 build_scripts/fixed_cost_floor.py --json 2>&1 | tee "$OUT/floor.jsonl" | cut -c1-200 ;;
  *) echo "usage: $0 stage old|new | bench [ROUNDS] | tests | memcheck | racecheck | floor" >&2; exit 2 ;;
esac
