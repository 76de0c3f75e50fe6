#!/usr/bin/env python3
"""Instruction budget of a kernel's main loop, from the SASS of the built kernel library.

Counts the SASS instructions of one kernel by class (integer, look-ups, floating point, tensor
cores, global and shared memory, control), for its prologue, its main loop (the backward branch
that spans the most instructions), what follows the loop, and the out-of-line code after the last
EXIT. Address ranges given with --cold are left out of the loop's hot path (blocks that a
typical iteration skips: a refill once per 32 tiles, a page-crossing copy, the masking of a
partial tile) and reported on their own. Each count is per warp and loop iteration; with
--tokens-per-iteration the loop's counts are also divided per token (docs/DECODE_BUDGET.md).

Needs cuobjdump and nvdisasm (CUDA's bin directory, or the PyPI packages nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm) on PATH, or their paths in CUOBJDUMP / NVDISASM_PATH. Reads the library
only; it never builds anything.

    python build_scripts/sass_budget.py 'attention_split_kernelILi128ELi1ELi1ELi3ELi3ELi3ELi1ELi8E6__halfLb0E' \
        --cold 0x5080-0x5850 --cold 0x5cb0-0x6210 --cold 0x7470-0x7610 \
        --tokens-per-iteration 32 --out docs/results/sass_budget.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LIBRARY = ROOT / "build/plugin_cpp/kernels/libtq_kernels.so"

# Opcode (the mnemonic before the first dot) -> class. Uniform-datapath opcodes (U...) are the
# warp's scalar bookkeeping and count as control; anything unlisted is "other".
CLASSES = {
    "lookup": ("PRMT", "LOP3"),
    "integer": ("IMAD", "IADD3", "IADD", "SHF", "LEA", "ISETP", "SEL", "IABS", "VIADD", "VIADDMNMX",
                "VIMNMX", "IMNMX", "MOV", "PLOP3", "P2R", "R2P", "POPC", "FLO", "BREV", "SGXT", "BMSK",
                "I2IP", "LOP", "SHL", "SHR"),
    "float": ("FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "FSET", "MUFU", "F2F", "F2FP", "I2F",
              "F2I", "HADD2", "HFMA2", "HMUL2", "HMNMX2", "HSETP2", "FRND", "FCHK", "DADD", "DFMA", "DMUL", "I2FP", "F2IP"),
    "tensor": ("HMMA", "IMMA", "HGMMA", "IGMMA", "QGMMA", "BMMA"),
    "global": ("LDG", "LDGSTS", "STG", "LDC", "RED", "ATOM", "ATOMG", "LDGDEPBAR", "UBLKCP", "UTMALDG"),
    "shared": ("LDS", "LDSM", "STS", "ATOMS", "STSM", "SHFL", "MOVM"),  # with the lanes' exchanges
    "control": ("BRA", "BSSY", "BSYNC", "WARPSYNC", "DEPBAR", "NOP", "BAR", "EXIT", "PREEXIT", "VOTE",
                "VOTEU", "S2R", "CS2R", "S2UR", "YIELD", "CALL", "RET", "WARPGROUP", "ACQBULK", "ELECT",
                "SYNCS", "MEMBAR", "ERRBAR", "CCTL", "BPT", "NANOSLEEP", "ENDCOLLECTIVE"),
}
OPCODE_CLASS = {op: cls for cls, ops in CLASSES.items() for op in ops}
# Opcodes that issue to the ALU pipe, half the issue rate (16 lanes per scheduler; tq_pipe_rates
# measures PRMT, LOP3, SHF at 63 thread ops per SM and clock): integer and logic work but IMAD,
# FP32 comparisons, min / max and selects, FP32 to FP16 packing (Nsight Compute's pipe list).
ALU_PIPE = ("PRMT", "LOP3", "SHF", "IADD3", "ISETP", "LEA", "SEL", "IABS", "VIMNMX", "IMNMX", "PLOP3",
            "FMNMX", "FSEL", "FSETP", "F2FP", "POPC", "FLO", "BREV", "SGXT", "BMSK")
LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH_TARGET = re.compile(r"\b0x([0-9a-f]+)\s*$")


class BudgetError(Exception):
    """A problem the user can fix: said in one line, no traceback."""


def tool(name: str, env: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise BudgetError(f"{name} not found: put CUDA's bin directory on PATH, set {env}, or "
                          f"pip install nvidia-cuda-{name}")
    return path


def run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise BudgetError(f"{' '.join(cmd[:2])} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def find_function(cuobjdump: str, library: Path, pattern: str) -> str:
    names = [line.rsplit(" : ", 1)[1] for line in run([cuobjdump, "-ltext", str(library)]).splitlines()
             if " : " in line]
    names = [re.sub(r"\.sm_\d+a?\.elf\.bin$", "", n.split("-", 1)[1] if "-" in n else n) for n in names]
    hits = sorted({n for n in names if re.search(pattern, n)})
    if len(hits) != 1:
        raise BudgetError(f"pattern {pattern!r} matches {len(hits)} kernels of {library.name}; "
                          "give a pattern that matches exactly one (cuobjdump -ltext lists them)")
    return hits[0]


def parse_sass(text: str) -> list[tuple[int, str]]:
    """(address, instruction text without its predicate guard) of each instruction."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    if not out:
        raise BudgetError("no SASS instructions in cuobjdump's output")
    return out


def opcode(ins: str) -> str:
    words = ins.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def classify(op: str) -> str:
    base = op.split(".")[0]
    if base in OPCODE_CLASS:
        return OPCODE_CLASS[base]
    if base.startswith("U"):
        return "control"
    return "other"


def count(instrs: list[tuple[int, str]]) -> dict:
    ops = Counter(opcode(i).split(".")[0] for _, i in instrs)
    classes = Counter()
    for op, n in ops.items():
        classes[classify(op)] += n
    return {"instructions": len(instrs), "alu_pipe": sum(n for op, n in ops.items() if op in ALU_PIPE),
            "by_class": dict(sorted(classes.items())),
            "by_opcode": dict(ops.most_common())}


def parse_range(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(0x[0-9a-fA-F]+)-(0x[0-9a-fA-F]+)", text)
    if not m or int(m.group(1), 16) >= int(m.group(2), 16):
        raise argparse.ArgumentTypeError(f"{text!r} is not START-END in hex with START < END (0x5080-0x5850)")
    return int(m.group(1), 16), int(m.group(2), 16)


def budget(instrs: list[tuple[int, str]], cold: list[tuple[int, int]], tokens: int | None) -> dict:
    exits = [a for a, i in instrs if opcode(i) == "EXIT"]
    last_exit = max(exits) if exits else instrs[-1][0]
    backward = []  # the out-of-line code after the last EXIT branches back too: not a loop
    for addr, ins in instrs:
        if addr < last_exit and opcode(ins).startswith("BRA"):
            t = BRANCH_TARGET.search(ins)
            if t and int(t.group(1), 16) < addr:
                backward.append((addr - int(t.group(1), 16), int(t.group(1), 16), addr))
    if not backward:
        raise BudgetError("the kernel has no backward branch: no loop to count")
    _, start, end = max(backward)
    loop = [(a, i) for a, i in instrs if start <= a <= end]
    for lo, hi in cold:
        if not (start <= lo and hi <= end + 16):
            raise BudgetError(f"cold range {lo:#x}-{hi:#x} lies outside the loop {start:#x}-{end:#x}")
    is_cold = lambda a: any(lo <= a < hi for lo, hi in cold)
    hot = [(a, i) for a, i in loop if not is_cold(a)]
    result = {
        "loop": {"start": f"{start:#x}", "end": f"{end:#x}"},
        "prologue": count([(a, i) for a, i in instrs if a < start]),
        "loop_static": count(loop),
        "loop_hot": count(hot),
        "cold_blocks": [{"range": f"{lo:#x}-{hi:#x}", **count([(a, i) for a, i in loop if lo <= a < hi])}
                        for lo, hi in cold],
        "after_loop": count([(a, i) for a, i in instrs if end < a <= last_exit]),
        "out_of_line": count([(a, i) for a, i in instrs if a > last_exit]),
        "total_static": len(instrs),
    }
    if tokens:
        hot_count = result["loop_hot"]
        result["tokens_per_iteration"] = tokens
        result["loop_hot_per_token"] = {
            "instructions": round(hot_count["instructions"] / tokens, 3),
            "alu_pipe": round(hot_count["alu_pipe"] / tokens, 3),
            "by_class": {k: round(v / tokens, 3) for k, v in hot_count["by_class"].items()},
        }
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pattern", help="regular expression matching exactly one kernel's mangled name")
    ap.add_argument("--library", type=Path, default=DEFAULT_LIBRARY, help="the kernel library (read only)")
    ap.add_argument("--cold", type=parse_range, action="append", default=[],
                    help="START-END (hex, END exclusive): a loop block left out of the hot path; repeatable")
    ap.add_argument("--tokens-per-iteration", type=int, default=None,
                    help="tokens of one KV head that one loop iteration of a warp serves (32 for the split pass)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here (else stdout)")
    args = ap.parse_args(argv)
    try:
        if not args.library.is_file():
            raise BudgetError(f"{args.library} does not exist: build it with build_scripts/install.sh first")
        if args.tokens_per_iteration is not None and args.tokens_per_iteration <= 0:
            raise BudgetError("--tokens-per-iteration must be positive")
        cuobjdump = tool("cuobjdump", "CUOBJDUMP")
        nvdisasm = tool("nvdisasm", "NVDISASM_PATH")  # cuobjdump -sass runs it from PATH
        nvdisasm_dir = nvdisasm if os.path.isdir(nvdisasm) else os.path.dirname(nvdisasm)
        os.environ["PATH"] = nvdisasm_dir + os.pathsep + os.environ.get("PATH", "")
        name = find_function(cuobjdump, args.library, args.pattern)
        instrs = parse_sass(run([cuobjdump, "-sass", "-fun", name, str(args.library)]))
        library = args.library.resolve()
        shown = library.relative_to(ROOT) if library.is_relative_to(ROOT) else library
        result = {"kernel": name, "library": str(shown), **budget(instrs, args.cold, args.tokens_per_iteration)}
    except BudgetError as e:
        print(f"sass_budget: {e}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        fd, tmp = tempfile.mkstemp(dir=args.out.parent, prefix=args.out.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
