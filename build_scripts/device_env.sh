# Sourced by the device_*.sh scripts: the repository root as working directory, the log folder
# $OUT (default ./device_out), and the environment that finds the package and the built library.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-device_out}"; mkdir -p "$OUT"
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export TQ_KERNELS_LIB="${TQ_KERNELS_LIB:-build/plugin_cpp/kernels/libtq_kernels.so}"
# on the GPU machine a GPU test or a plugin test that cannot run fails instead of skipping
export TQ_REQUIRE_GPU=1 TQ_REQUIRE_PLUGIN=1
# What build_scripts/device_bench_prep.sh staged, unpacked into $TQ_STAGE once per machine: the
# kernel library, plugin, harness and C++ example (device_carry/lib), FlashInfer (device_carry/fi).
TQ_STAGE=/tmp/tq_stage
if [[ -d device_carry/fi && ! -d $TQ_STAGE/site/flashinfer ]]; then
  mkdir -p "$TQ_STAGE/site"
  xz -T8 -dc device_carry/fi/flashinfer.tar.xz | tar xf - -C "$TQ_STAGE/site"
  python3 -m pip install -q --no-index --no-deps --target "$TQ_STAGE/site" device_carry/fi/apache_tvm_ffi-*.whl
fi
if [[ -d device_carry/lib ]]; then
  mkdir -p "$TQ_STAGE/bin"
  for f in device_carry/lib/*.xz; do
    xz -T8 -dc "$f" > "$TQ_STAGE/bin/$(basename "${f%.xz}")"; chmod +x "$TQ_STAGE/bin/$(basename "${f%.xz}")"
  done
  export TQ_KERNELS_LIB=$TQ_STAGE/bin/libtq_kernels.so
  if [[ -f device_carry/lib/REVISION ]]; then export TQ_REVISION=$(cat device_carry/lib/REVISION); fi
fi
# A previous library to compare against (device_verify_prep.sh), and this tree's revision.
if [[ -f device_carry/old/libtq_kernels.so.xz && ! -f $TQ_STAGE/old/libtq_kernels.so ]]; then
  mkdir -p "$TQ_STAGE/old"; xz -T8 -dc device_carry/old/libtq_kernels.so.xz > "$TQ_STAGE/old/libtq_kernels.so"
fi
if [[ -f device_carry/old/REVISION ]]; then export TQ_REVISION=$(cat device_carry/old/REVISION); fi
if [[ -d $TQ_STAGE/site/flashinfer ]]; then
  export PYTHONPATH=$TQ_STAGE/site:$PYTHONPATH FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
fi
