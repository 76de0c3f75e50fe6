#!/usr/bin/env bash
# Configure and build libtq_kernels for Hopper (sm_90a) into ./build.
# The library lands in build/plugin_cpp/kernels/libtq_kernels.so; tq_trtllm.kernels finds it there
# (or set TQ_KERNELS_LIB). Extra CMake arguments pass through, e.g. -DCMAKE_BUILD_TYPE=Debug.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-2}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" \
  -DTQ_REQUIRE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real "$@"
cmake --build build -j "$JOBS"
