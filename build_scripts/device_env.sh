# Sourced by the device_*.sh scripts: the repository root as working directory, the log folder
# $OUT (default ./device_out), and the environment that finds the package and the built library.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-device_out}"; mkdir -p "$OUT"
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export TQ_KERNELS_LIB="${TQ_KERNELS_LIB:-build/plugin_cpp/kernels/libtq_kernels.so}"
