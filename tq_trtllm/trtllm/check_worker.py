"""One run of tq-eval trtllm-check's engine side, in its own process (under mpirun for tp > 1):
prefill a prompt and generate greedily through ModelRunnerCpp, saving the tokens and every
generation logit row (rank 0).

    python -m tq_trtllm.trtllm.check_worker ENGINE_DIR PROMPT_JSON OUT_NPZ NEW_TOKENS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main(argv: list[str]) -> int:
    engine, prompt, out, new_tokens = argv
    from .runner import generate, open_engine

    ids = json.loads(Path(prompt).read_text())
    opened = open_engine(engine, max_input_len=len(ids), max_output_len=len(ids) + int(new_tokens),
                         what="tq-eval trtllm-check", gather_logits=True)
    result = generate(opened, ids, int(new_tokens), logits=True, stop_at_eos=False)
    if opened.rank == 0:
        np.savez(out, tokens=np.array(result["ids"], dtype=np.int64), logits=result["logits"].numpy())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
