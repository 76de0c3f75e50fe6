#!/usr/bin/env bash
# Build the CUDA kernel library (sm_90a), the C++ example and, where TensorRT's headers are found,
# the QuantizedAttention plugin into ./build, incrementally: a second run recompiles only what
# changed. tq_trtllm.kernels finds build/plugin_cpp/kernels/libtq_kernels.so (or set TQ_KERNELS_LIB).
# Extra CMake arguments pass through, e.g. -DCMAKE_BUILD_TYPE=Debug.
#
# Memory: ptxas on an attention unit peaks near 10 GB. Those units compile one at a time whatever
# JOBS says (a Ninja job pool, plugin_cpp/kernels/CMakeLists.txt); JOBS sets the light units' jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"
BUILD="${TQ_BUILD_DIR:-build}"
free_gb=$(awk '/MemAvailable/ {printf "%d", $2 / 1048576}' /proc/meminfo)
mkdir -p "$BUILD"
echo "build_kernels: configuring $BUILD (CUDA sm_90a; ${free_gb} GB of memory free)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" \
  -DTQ_REQUIRE_CUDA=ON -DTQ_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real "$@" >"$BUILD/tq-configure.log" 2>&1 \
  || { cat "$BUILD/tq-configure.log"; echo "build_kernels: CMake configure failed (above)" >&2; exit 1; }
grep -E "^-- tq_trtllm|^CMake Warning" -A1 "$BUILD/tq-configure.log" | grep -v "^--$" || true
echo "build_kernels: compiling (the attention units take several minutes each on 2 cores)"
start=$(date +%s)
# Ninja's status line, one per finished step, as plain lines instead of a redrawn one.
set +e
NINJA_STATUS="[%f/%t %es] " cmake --build "$BUILD" -j "$JOBS" 2>&1 | tee "$BUILD/tq-build.log" \
  | grep --line-buffered -E "^\[[0-9]+/[0-9]+ |error|Killed|killed"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo >&2
  echo "build_kernels: the CUDA build FAILED (full log: $BUILD/tq-build.log)." >&2
  if grep -qiE "killed|signal 9|out of memory" "$BUILD/tq-build.log"; then
    echo "  ptxas was killed for memory: an attention unit needs about 10 GB per ptxas process" >&2
    echo "  and ${free_gb} GB were free. Free memory, or run one ptxas at a time:" >&2
    echo "    bash build_scripts/build_kernels.sh -DTQ_CUDA_SPLIT=1" >&2
  fi
  echo "  To install without the CUDA library (CPU reference only): TQ_CUDA=0 bash build_scripts/install.sh" >&2
  exit "$status"
fi
echo "build_kernels: done in $(( $(date +%s) - start )) s: $BUILD/plugin_cpp/kernels/libtq_kernels.so"
