#!/usr/bin/env bash
# The project's test command (README, .ci/run): install (incremental: a second run recompiles
# nothing unchanged), then the whole pytest suite.
# Where nvcc exists, the CUDA build and the TensorRT plugin are required: a test that needs them
# fails instead of skipping when they are missing. GPU tests skip with a reason on a machine without
# an NVIDIA GPU (the device scripts set TQ_REQUIRE_GPU=1).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvcc >/dev/null 2>&1; then
  export TQ_CUDA=1 TQ_REQUIRE_CUDA_BUILD=1 TQ_REQUIRE_PLUGIN=1
fi
# The serve extra (Triton's server and client) is part of every install: its tests never skip.
export TQ_REQUIRE_SERVE=1
bash build_scripts/install.sh
.venv/bin/python -m pytest -q -rs "$@"
