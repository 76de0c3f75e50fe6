#!/usr/bin/env bash
# Here, before build_scripts/device_check.sh on the GPU machine: what its calls carry (ignored
# folders; name them in the call's carry). A call carries at most 64 MiB, so two calls, back to back
# (an idle machine is given back, and with it what the first staged):
#   device_carry/fi/   FlashInfer for tq-bench decode's FP8 column, pruned to what its paged decode
#                      JIT-compiles from (the Python package, its headers, CUTLASS's and CCCL's
#                      include folders, the top-level csrc files) with apache-tvm-ffi, the one
#                      dependency the GPU machine lacks (15 MB):
#                      bash build_scripts/device_check.sh stage
#   device_carry/lib/  the built kernel library, plugin, harness and C++ example, xz (about 55 MB):
#                      bash build_scripts/device_check.sh tests|bench|all
set -euo pipefail
cd "$(dirname "$0")/.."
FLASHINFER="${FLASHINFER:-flashinfer-python==0.7.2.post1}"
dest=device_carry/lib
lib=$(python3 -c "from tq_trtllm.kernels._lib import find_library; print(find_library() or '')")
[[ -n "$lib" ]] || { echo "the kernel library is not built: run build_scripts/install.sh" >&2; exit 1; }
rm -rf "$dest" device_carry/fi; mkdir -p "$dest" device_carry/fi
xz -T0 -c "$lib" > "$dest/libtq_kernels.so.xz"
# The revision the rows name (run_record.py): the GPU machine's copy has no git history of its own.
echo "$(git rev-parse --short=12 HEAD)$([[ -n $(git status --porcelain --untracked-files=no) ]] && echo -dirty)" \
  > "$dest/REVISION"
for plugin in build/plugin_cpp/plugin/libtq_attention_plugin.so build/plugin_cpp/plugin/tq_plugin_harness; do
  [[ -f $plugin ]] && xz -T0 -c "$plugin" > "$dest/$(basename "$plugin").xz"
done
[[ -f build/examples/cpp/tq_decode_step ]] && xz -T0 -c build/examples/cpp/tq_decode_step > "$dest/tq_decode_step.xz"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d "$work" "$1"; }
get "$FLASHINFER"; get "apache-tvm-ffi>=0.1.11,<0.2"
cp "$work"/apache_tvm_ffi-*.whl device_carry/fi/
(cd "$work" && unzip -q flashinfer_python-*.whl 'flashinfer/*'
 find flashinfer/data/csrc -mindepth 1 -type d -prune -exec rm -rf {} +
 rm -rf flashinfer/data/cutlass/{python,examples,test,tools} flashinfer/data/cccl/python
 tar cf - flashinfer | xz -T0 -6 > flashinfer.tar.xz)
mv "$work/flashinfer.tar.xz" device_carry/fi/
du -sh "$dest"/* device_carry/fi/*
