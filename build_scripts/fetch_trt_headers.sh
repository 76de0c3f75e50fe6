#!/usr/bin/env bash
# Fetch TensorRT's OSS C++ headers (Apache-2.0, github.com/NVIDIA/TensorRT, include/) into
# third_party_headers/trt-<name>/include, for building the QuantizedAttention plugin where TensorRT
# itself is not installed. The folder is git-ignored: NVIDIA's headers are never committed here.
# Usage: build_scripts/fetch_trt_headers.sh [BRANCH...]   (default: release/10.13 release/11.1)
set -euo pipefail
cd "$(dirname "$0")/.."
branches=("$@")
[ ${#branches[@]} -gt 0 ] || branches=(release/10.13 release/11.1)
for branch in "${branches[@]}"; do
  name="trt-${branch#release/}"
  [ "$name" = "trt-11.1" ] && name="trt-11.x"
  dest="third_party_headers/$name"
  tmp="$(mktemp -d)"
  git clone --quiet --depth 1 --filter=blob:none --sparse --branch "$branch" \
    https://github.com/NVIDIA/TensorRT.git "$tmp"
  git -C "$tmp" sparse-checkout set include
  rm -rf "$dest"
  mkdir -p "$dest"
  cp -r "$tmp/include" "$dest/"
  rm -rf "$tmp"
  echo "fetch_trt_headers: $branch -> $dest/include"
done
