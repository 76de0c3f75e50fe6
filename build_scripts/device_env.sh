# Sourced by the device_*.sh scripts: the repository root as working directory, the log folder
# $OUT (default ./device_out), and the environment that finds the package and the built library.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-device_out}"; mkdir -p "$OUT"
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export TQ_KERNELS_LIB="${TQ_KERNELS_LIB:-build/plugin_cpp/kernels/libtq_kernels.so}"
# on the GPU machine a GPU test or a plugin test that cannot run fails instead of skipping
export TQ_REQUIRE_GPU=1 TQ_REQUIRE_PLUGIN=1
# What build_scripts/device_bench_prep.sh staged, unpacked once per machine: the kernel library,
# the plugin, the C++ example and FlashInfer (tq-bench decode's FP8 column).
if [[ -d device_carry/bench ]]; then
  stage=/tmp/tq_bench
  if [[ ! -d $stage/site/flashinfer ]]; then
    mkdir -p "$stage/site"
    for f in device_carry/bench/*.xz; do
      [[ $f == *flashinfer.tar.xz ]] && continue
      xz -dc "$f" > "$stage/$(basename "${f%.xz}")"; chmod +x "$stage/$(basename "${f%.xz}")"
    done
    xz -T8 -dc device_carry/bench/flashinfer.tar.xz | tar xf - -C "$stage/site"
    python3 -m pip install -q --no-index --no-deps --target "$stage/site" device_carry/bench/apache_tvm_ffi-*.whl
  fi
  export PYTHONPATH=$stage/site:$PYTHONPATH TQ_KERNELS_LIB=$stage/libtq_kernels.so
  export FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
fi
