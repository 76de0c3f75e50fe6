"""Running a TensorRT-LLM engine directory through TensorRT-LLM 1.2's own runtime, ModelRunnerCpp
(the C++ executor: in-flight batching, the paged KV pool), with the plugin library loaded first.

Written against TensorRT-LLM 1.2's Python API (tensorrt_llm.runtime.ModelRunnerCpp); it runs only
where TensorRT-LLM is installed. Tensor parallelism: launch under `mpirun -n <tp size>`; every rank
runs the same command, rank 0 prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.errors import TQError
from .engine_dir import TOKENIZER_DIR, library_dir, read_trtllm_manifest
from .plugin_libraries import DYNAMIC, register_with_tensorrt
from .requirement import require_tensorrt_llm

FORCING = "tq_teacher_forcing"  # the logits post-processor of teacher-forced decoding


@dataclass
class OpenedEngine:
    path: Path
    manifest: dict
    runner: object  # ModelRunnerCpp
    tokenizer: object
    rank: int


def load_tokenizer(path: Path, manifest: dict):
    from ..models.checkpoint import _transformers

    return _transformers().AutoTokenizer.from_pretrained(
        str(path / manifest["trtllm"].get("tokenizer", TOKENIZER_DIR)), local_files_only=True)


def open_engine(engine_dir, *, max_input_len: int | None = None, max_output_len: int | None = None,
                logits_processors: dict | None = None, what: str = "--backend trtllm",
                gather_logits: bool = False) -> OpenedEngine:
    """The engine's ModelRunnerCpp on this MPI rank: block reuse (and with it partial reuse), chunked
    context and CUDA graphs off (docs/TRTLLM.md says why). max_input_len / max_output_len: the
    longest prompt and the most new tokens (their sum at most the engine's max_seq_len; None: the
    engine's limits)."""
    require_tensorrt_llm(what)
    path = Path(engine_dir)
    manifest = read_trtllm_manifest(path)
    section = manifest["trtllm"]
    from tensorrt_llm._utils import mpi_rank, mpi_world_size
    from tensorrt_llm.runtime import ModelRunnerCpp

    if mpi_world_size() != section["tp_size"]:
        raise TQError(f"{path} holds {section['tp_size']} tensor-parallel engines; run under "
                      f"mpirun -n {section['tp_size']} (this process sees {mpi_world_size()} ranks)")
    register_with_tensorrt(library_dir(path, manifest) / DYNAMIC)
    kwargs = {"logits_processor_map": logits_processors} if logits_processors else {}
    runner = ModelRunnerCpp.from_dir(
        engine_dir=str(path), rank=mpi_rank(), max_batch_size=1, max_beam_width=1,
        max_input_len=max_input_len, max_output_len=max_output_len,
        kv_cache_enable_block_reuse=False, enable_chunked_context=False, cuda_graph_mode=False,
        gather_generation_logits=gather_logits, **kwargs)
    return OpenedEngine(path, manifest, runner, load_tokenizer(path, manifest), mpi_rank())


def generate(opened: OpenedEngine, ids: list[int], max_new_tokens: int, *, logits: bool = False,
             processor: str | None = None, stop_at_eos: bool = True) -> dict:
    """Greedy generation of one request: new token ids, and with `logits` the generation logits
    ([max_new_tokens, vocab] float32; the first row is the prefill's)."""
    tokenizer = opened.tokenizer
    # forced runs and checks never stop early
    end_id = tokenizer.eos_token_id if processor is None and stop_at_eos else -1
    kwargs = {"logits_processor_names": [processor]} if processor else {}
    out = opened.runner.generate(
        batch_input_ids=[torch.tensor(ids, dtype=torch.int32)], max_new_tokens=max_new_tokens,
        end_id=end_id, pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        top_k=1, num_beams=1, return_dict=True, output_sequence_lengths=True,
        output_generation_logits=logits, **kwargs)
    if isinstance(out, list) and not out:  # ranks above 0 of a tensor-parallel engine enqueue nothing
        return {"ids": [], "logits": None}
    torch.cuda.synchronize()
    length = int(out["sequence_lengths"][0][0])
    result = {"ids": out["output_ids"][0][0][len(ids):length].tolist()}
    if logits:
        result["logits"] = out["generation_logits"][0][0].float().cpu()
    return result


def kv_bytes(manifest: dict, layers: int, kv_heads: int, tokens: int) -> dict:
    """Bytes a `tokens`-long sequence takes in this engine's pool (whole blocks aside) and in an
    FP16 pool of the same model."""
    t = manifest["trtllm"]
    packed = layers * 2 * kv_heads * t["head_size"] * 2 * tokens
    return {"kv_bytes": packed, "kv_bytes_fp16": layers * 2 * kv_heads * t["head_dim"] * 2 * tokens}


def run_prompt(engine_dir, prompt: str, max_new_tokens: int, chat: bool) -> dict | None:
    """tq-run --backend trtllm: the text generated for `prompt` (None on ranks other than 0)."""
    from ..cli.run import prompt_ids

    opened = open_engine(engine_dir, what="tq-run --backend trtllm")
    ids = prompt_ids(opened.tokenizer, prompt, chat)[0].tolist()
    t = opened.manifest["trtllm"]
    if len(ids) + max_new_tokens > t["max_seq_len"]:
        raise TQError(f"the prompt has {len(ids)} tokens; with {max_new_tokens} new tokens that exceeds "
                      f"the engine's --max-seq-len {t['max_seq_len']}")
    out = generate(opened, ids, max_new_tokens)
    if opened.rank != 0:
        return None
    fp = opened.manifest["fingerprint"]
    tokens = len(ids) + len(out["ids"])
    return {"text": opened.tokenizer.decode(out["ids"], skip_special_tokens=True), "prompt_tokens": len(ids),
            "new_tokens": len(out["ids"]), "cached_tokens": tokens, "backend": "trtllm",
            **kv_bytes(opened.manifest, int(fp["layers"]), int(fp["kv_heads"]), tokens)}


class TeacherForcing:
    """A logits post-processor that records each step's log-probability of the next token of a
    known sequence and its argmax, then forces that token: teacher-forced decoding through the
    runtime's generation steps, each reading the history from the packed pool."""

    def __init__(self):
        self.target: list[int] = []
        self.prompt_len = 0
        self.nll: list[torch.Tensor] = []
        self.top: list[torch.Tensor] = []

    def start(self, target: list[int], prompt_len: int) -> None:
        self.target, self.prompt_len, self.nll, self.top = target, prompt_len, [], []

    def __call__(self, req_id, logits, token_ids, stream_ptr, client_id=None):
        step = len(token_ids[0])  # tokens so far; the next one is target[step]
        with torch.cuda.stream(torch.cuda.ExternalStream(stream_ptr)):
            row = logits.view(-1, logits.shape[-1])[0]
            nxt = self.target[step]
            self.nll.append(-torch.log_softmax(row.float(), dim=-1)[nxt])
            self.top.append(row.argmax())
            row.fill_(float("-inf"))
            row[nxt] = 0.0

    def result(self) -> tuple[float, list[int]]:
        torch.cuda.synchronize()
        return torch.stack(self.nll).mean().item(), [int(t) for t in torch.stack(self.top).tolist()]


def window_nll(opened: OpenedEngine, forcing: TeacherForcing, window: list[int]) -> tuple[float, list[int]]:
    """Mean NLL of window[1:] given the earlier tokens, read through the pool one generation step
    at a time (the protocol of tq-eval ppl: every earlier position read from the cache)."""
    forcing.start(window, 1)
    generate(opened, window[:1], len(window) - 1, processor=FORCING)
    return forcing.result()
