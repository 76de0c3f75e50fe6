#!/usr/bin/env bash
# The project's test command (README, .ci/run): install, then the whole pytest suite.
# GPU tests skip with a reason on a machine without an NVIDIA GPU and the built kernel library.
set -euo pipefail
cd "$(dirname "$0")/.."
bash build_scripts/install.sh
.venv/bin/python -m pytest -q -rs "$@"
