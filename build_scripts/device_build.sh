#!/usr/bin/env bash
# On the GPU machine: build the kernel library, the C++ example, the TensorRT plugin and its
# harness from the carried tree with the machine's nvcc and cores (a few minutes on 16 cores),
# then the GPU tests, the plugin harness and the C++ example over them. TensorRT's headers come from
# device_carry/trt/include (build_scripts/device_verify_prep.sh copies them there; never committed).
# Usage: build_scripts/device_build.sh [build|tests|all]
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
what="${1:-all}"
if [[ "$what" == build || "$what" == all ]]; then
  JOBS=$(nproc) bash build_scripts/build_kernels.sh -DTENSORRT_INCLUDE_DIR="$PWD/device_carry/trt/include" \
    -DTQ_CUDA_SPLIT=12 2>&1 | tail -4 | tee "$OUT/build.log" || exit 1
fi
export TQ_KERNELS_LIB=build/plugin_cpp/kernels/libtq_kernels.so TQ_PLUGIN_BUILD_DIR=build/plugin_cpp/plugin
if [[ "$what" == tests || "$what" == all ]]; then
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  python3 -m pytest tests/gpu tests/test_kernels_binding.py tests/test_kernel_abi.py tests/test_kernel_host_checks.py \
    -q -rs 2>&1 | tee "$OUT/tests.log" | tail -15
  for n in 1 4096 131072; do build/examples/cpp/tq_decode_step "$n" 2>&1 | tail -2; done | tee "$OUT/decode_step.log"
fi
