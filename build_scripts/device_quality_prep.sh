#!/usr/bin/env bash
# Here, before build_scripts/device_quality.sh: what its calls carry, under device_carry/ (ignored).
# A call carries at most 64 MiB, so the default model's GGUF file (98 MB) is split over two calls
# (part1/, part2/); run/ holds the built kernel library (xz: gzipped it no longer fits beside the
# engines) and the gguf wheel transformers needs to read that file, which the GPU machine lacks
# and cannot download.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=device_carry
gguf=$(python3 -c "from tq_trtllm.models.checkpoint import default_checkpoint; print(default_checkpoint())")
lib=$(python3 -c "from tq_trtllm.kernels._lib import find_library; print(find_library() or '')")
[[ -n "$lib" ]] || { echo "the kernel library is not built: run build_scripts/install.sh" >&2; exit 1; }
rm -rf "$dest"; mkdir -p "$dest/part1" "$dest/part2" "$dest/run"
head -c 50000000 "$gguf" > "$dest/part1/model.gguf.part"
tail -c +50000001 "$gguf" > "$dest/part2/model.gguf.part"
xz -T0 -c "$lib" > "$dest/run/libtq_kernels.so.xz"
version=$(python3 -c "import importlib.metadata as m; print(m.version('gguf'))")
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dest/run" "gguf==$version"
md5sum "$gguf" | cut -d' ' -f1 > "$dest/run/model.gguf.md5"
du -sh "$dest"/*
