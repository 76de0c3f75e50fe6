#!/usr/bin/env bash
# Here, before build_scripts/device_build.sh and device_check.sh compare: what their calls carry
# (ignored folders): device_carry/trt/include, TensorRT's OSS headers for the plugin build
# (from ../shared/third_party/tensorrt-oss or $TENSORRT_INCLUDE_DIR), device_carry/old/, a
# previous kernel library (xz) to time the built one against in the same call, and the REVISION of
# this tree for the rows (run_record.py).
# Usage: build_scripts/device_verify_prep.sh OLD_LIBRARY
set -euo pipefail
cd "$(dirname "$0")/.."
old="${1:?usage: $0 OLD_LIBRARY (a libtq_kernels.so to compare against)}"
headers="${TENSORRT_INCLUDE_DIR:-../shared/third_party/tensorrt-oss/10.13/include}"
[[ -f $headers/NvInferRuntime.h ]] || { echo "no TensorRT headers at $headers" >&2; exit 1; }
rm -rf device_carry/trt device_carry/old; mkdir -p device_carry/trt device_carry/old device_carry/lib
cp -r "$headers" device_carry/trt/include
xz -T0 -c "$old" > device_carry/old/libtq_kernels.so.xz
echo "$(git rev-parse --short=12 HEAD)$([[ -n $(git status --porcelain --untracked-files=no) ]] && echo -dirty)" \
  > device_carry/old/REVISION
du -sh device_carry/trt device_carry/old
