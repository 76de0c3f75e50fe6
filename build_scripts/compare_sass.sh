#!/usr/bin/env bash
# Compare the machine code (SASS) of every kernel in two builds of libtq_kernels.so, to show that
# a change which only moves or renames kernel code leaves the kernels as they were.
#
#   bash build_scripts/compare_sass.sh BEFORE.so AFTER.so [OUT_DIR]
#
# Each kernel's listing (cuobjdump -sass) is normalized before the comparison: instruction
# addresses and encodings are dropped, and the anonymous namespace's per-file tag in mangled names
# (_GLOBAL__N__<hash>_<n>_<file>_<hash>) becomes _GLOBAL__N_, so that a kernel moved to another
# file keeps its name. Branch targets, registers, constant-bank offsets (the kernel's parameters)
# and every instruction stay in. The listings land in OUT_DIR (default: a temporary folder), one
# file per kernel under before/ and after/, with a unified diff per changed kernel in diffs/.
# Prints one line per changed, added or removed kernel (demangled), then the summary:
#   "compare_sass: N kernels identical, M changed (names), A only in AFTER, B only in BEFORE"
# Exit status: 0 when every kernel is identical and none was added or removed, 1 otherwise, 2 on
# a usage error.
# Build both with the same flags, TQ_CUDA_SPLIT included (build_kernels.sh -DTQ_CUDA_SPLIT=N; CMake
# picks it from the free memory otherwise): nvcc --split-compile=2 and =1 give the same source
# different register allocation and scheduling (20 of the 32 prefill kernels of one source, checked
# with this script). Either file may also be one unit's object (build/.../attention.cu.o).
set -euo pipefail
if [ $# -lt 2 ] || [ ! -f "$1" ] || [ ! -f "$2" ]; then
  echo "usage: $0 BEFORE.so AFTER.so [OUT_DIR]  (two builds of libtq_kernels.so)" >&2
  exit 2
fi
if ! command -v cuobjdump >/dev/null; then
  echo "compare_sass: cuobjdump not found: it is in the CUDA toolkit's bin/, or from PyPI:" >&2
  echo "  pip install --target T nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, then PATH=T/nvidia/cu13/bin:\$PATH" >&2
  exit 2
fi
out="${3:-$(mktemp -d)}"
mkdir -p "$out"
# A listing is kept beside the library's checksum: a second comparison in the same OUT_DIR against
# an unchanged library reuses it (cuobjdump takes minutes on the attention units).
for side in before:"$1" after:"$2"; do
  name=${side%%:*} lib=${side#*:}
  sum=$(sha256sum "$lib" | cut -d' ' -f1)
  if [ "$(cat "$out/$name.sha256" 2>/dev/null)" != "$sum" ]; then
    cuobjdump -sass "$lib" >"$out/$name.sass"
    echo "$sum" >"$out/$name.sha256"
  fi
done
python3 - "$out" <<'EOF'
import difflib
import re
import subprocess
import sys
from pathlib import Path

out = Path(sys.argv[1])
ANON = re.compile(r"(\d+)(_GLOBAL__N_)")  # <length><identifier> of the anonymous namespace


def normalized(name: str) -> str:
    """The mangled name with each anonymous namespace's identifier (its length prefix says where
    it ends) as 11_GLOBAL__N_."""
    while (m := ANON.search(name)) and name[m.end(1):m.end(1) + int(m.group(1))] != "_GLOBAL__N_":
        name = name[:m.start()] + "11_GLOBAL__N_" + name[m.end(1) + int(m.group(1)):]
    return name
ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")
ENCODING = re.compile(r"/\* 0x[0-9a-f]{16} \*/")
FATBIN_HEADER = re.compile(r"\s*(Fatbin \w+ code:|=+$|arch = |code version = |host = |compile_size = |"
                           r"compressed$|identifier = |code for sm_)")


def kernels(listing: Path) -> dict[str, list[str]]:
    """Normalized instruction lines of each function of a cuobjdump -sass listing, by name."""
    found, name, body = {}, None, []
    for line in listing.read_text().splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                found[name] = body
            name, body = normalized(m.group(1)), []
            while name in found:  # the same kernel in two fatbins: keep both
                name += "#"
            continue
        if FATBIN_HEADER.match(line):  # the next fatbin's header: the function ended
            if name:
                found[name] = body
            name, body = None, []
            continue
        if name is None:
            continue
        text = ENCODING.sub("", ADDR.sub("", line)).strip()
        if text and not text.startswith(".") and not set(text) <= {"."}:
            body.append(" ".join(text.split()))
    if name:
        found[name] = body
    return found


def demangle(names):
    try:
        done = subprocess.run(["c++filt"], input="\n".join(n.rstrip("#") for n in names), text=True,
                              capture_output=True, check=True).stdout.splitlines()
        return dict(zip(names, done))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


before, after = kernels(out / "before.sass"), kernels(out / "after.sass")
for side, found in (("before", before), ("after", after)):
    (out / side).mkdir(exist_ok=True)
    for i, (name, body) in enumerate(sorted(found.items())):
        (out / side / f"{i:05d}.sass").write_text(name + "\n" + "\n".join(body) + "\n")
(out / "diffs").mkdir(exist_ok=True)
same = sorted(n for n in before if n in after and before[n] == after[n])
changed = sorted(n for n in before if n in after and before[n] != after[n])
added = sorted(n for n in after if n not in before)
removed = sorted(n for n in before if n not in after)
names = demangle(changed + added + removed)
for i, n in enumerate(changed):
    diff = difflib.unified_diff(before[n], after[n], "before", "after", lineterm="", n=2)
    (out / "diffs" / f"{i:04d}.diff").write_text(n + "\n" + "\n".join(diff) + "\n")
    print(f"changed: {names[n]}  ({len(before[n])} -> {len(after[n])} instructions; diffs/{i:04d}.diff)")
for n in added:
    print(f"only in AFTER: {names[n]}")
for n in removed:
    print(f"only in BEFORE: {names[n]}")


def short(n: str) -> str:  # the kernel and its template arguments
    text = names[n].removeprefix("void ").replace("tq::(anonymous namespace)::", "")
    return text[:text.rfind("(")] if text.endswith(")") else text


print(f"compare_sass: {len(same)} kernels identical, {len(changed)} changed"
      + (f" ({'; '.join(short(n) for n in changed)})" if changed else "")
      + f", {len(added)} only in AFTER, {len(removed)} only in BEFORE (listings: {out})")
sys.exit(1 if changed or added or removed else 0)
EOF
