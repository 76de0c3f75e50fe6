"""A Triton model repository for TensorRT-LLM's Triton backend (1.2 era `inflight_batcher_llm`
layout: ensemble -> preprocessing -> tensorrt_llm -> postprocessing) over engines built with
tq-build --backend trtllm, and a launch script that preloads the plugin (docs/PLUGIN.md section 6).

The configs are written here (the tensor names are those of the backend's inflight_batcher_llm
models, so clients of that layout work unchanged); tests/test_trtllm_triton_repo.py parses every
config.pbtxt with Triton's model-config schema. Block reuse, chunked context and speculative
decoding stay off (docs/TRTLLM.md); beam width 1.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from ..core.errors import TQError
from .engine_dir import TOKENIZER_DIR, library_dir, read_trtllm_manifest
from .plugin_libraries import PRELOAD

LAUNCH_SCRIPT = "launch_triton.sh"
KV_FRACTION = 0.9


def _tensor(name: str, dtype: str, dims: list[int], *, optional: bool = False, ragged: bool = False,
            reshape_scalar: bool = False) -> str:
    parts = [f'name: "{name}"', f"data_type: {dtype}", f"dims: [ {', '.join(str(d) for d in dims)} ]"]
    if reshape_scalar:
        parts.append("reshape: { shape: [ ] }")
    if optional:
        parts.append("optional: true")
    if ragged:
        parts.append("allow_ragged_batch: true")
    return "  {\n    " + "\n    ".join(parts) + "\n  }"


def _tensors(kind: str, items: list[str]) -> str:
    return f"{kind} [\n" + ",\n".join(items) + "\n]\n"


def _parameters(values: dict) -> str:
    return "".join(f'parameters: {{\n  key: "{k}"\n  value: {{ string_value: "{v}" }}\n}}\n'
                   for k, v in values.items())


def _header(name: str, max_batch_size: int, backend: str | None = None, platform: str | None = None) -> str:
    lines = [f'name: "{name}"']
    if backend:
        lines.append(f'backend: "{backend}"')
    if platform:
        lines.append(f'platform: "{platform}"')
    lines.append(f"max_batch_size: {max_batch_size}")
    return "\n".join(lines) + "\n"


CPU_INSTANCE = "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n"


def preprocessing_config(name: str, max_batch_size: int, tokenizer_dir: Path) -> str:
    inputs = [_tensor("QUERY", "TYPE_STRING", [1]), _tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", [1]),
              _tensor("END_ID", "TYPE_INT32", [1], optional=True),
              _tensor("PAD_ID", "TYPE_INT32", [1], optional=True)]
    outputs = [_tensor("INPUT_ID", "TYPE_INT32", [-1]), _tensor("REQUEST_INPUT_LEN", "TYPE_INT32", [1]),
               _tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", [-1]), _tensor("OUT_END_ID", "TYPE_INT32", [1]),
               _tensor("OUT_PAD_ID", "TYPE_INT32", [1])]
    return (_header(name, max_batch_size, backend="python") + _tensors("input", inputs)
            + _tensors("output", outputs) + _parameters({"tokenizer_dir": tokenizer_dir}) + CPU_INSTANCE)


def postprocessing_config(name: str, max_batch_size: int, tokenizer_dir: Path) -> str:
    inputs = [_tensor("TOKENS_BATCH", "TYPE_INT32", [-1, -1]), _tensor("SEQUENCE_LENGTH", "TYPE_INT32", [-1])]
    outputs = [_tensor("OUTPUT", "TYPE_STRING", [-1])]
    return (_header(name, max_batch_size, backend="python") + _tensors("input", inputs)
            + _tensors("output", outputs) + _parameters({"tokenizer_dir": tokenizer_dir}) + CPU_INSTANCE)


def tensorrt_llm_config(name: str, max_batch_size: int, engine_dir: Path) -> str:
    inputs = [_tensor("input_ids", "TYPE_INT32", [-1], ragged=True),
              _tensor("input_lengths", "TYPE_INT32", [1], reshape_scalar=True),
              _tensor("request_output_len", "TYPE_INT32", [1], reshape_scalar=True),
              _tensor("end_id", "TYPE_INT32", [1], reshape_scalar=True, optional=True),
              _tensor("pad_id", "TYPE_INT32", [1], reshape_scalar=True, optional=True),
              _tensor("streaming", "TYPE_BOOL", [1], reshape_scalar=True, optional=True)]
    outputs = [_tensor("output_ids", "TYPE_INT32", [-1, -1]), _tensor("sequence_length", "TYPE_INT32", [-1])]
    params = {"gpt_model_type": "inflight_fused_batching", "gpt_model_path": engine_dir,
              "max_beam_width": 1, "batch_scheduler_policy": "guaranteed_no_evict",
              "kv_cache_free_gpu_mem_fraction": KV_FRACTION,
              # packed pages: no block reuse (so no partial reuse), no chunked context
              "enable_kv_cache_reuse": "false", "enable_chunked_context": "false",
              "exclude_input_in_output": "true", "FORCE_CPU_ONLY_INPUT_TENSORS": "no"}
    return (_header(name, max_batch_size, backend="tensorrtllm")
            + "model_transaction_policy {\n  decoupled: false\n}\n"
            + "dynamic_batching {\n}\n" + _tensors("input", inputs) + _tensors("output", outputs)
            + CPU_INSTANCE + _parameters(params))


def _step(model: str, inputs: dict, outputs: dict) -> str:
    maps = [f'      input_map {{\n        key: "{k}"\n        value: "{v}"\n      }}' for k, v in inputs.items()]
    maps += [f'      output_map {{\n        key: "{k}"\n        value: "{v}"\n      }}' for k, v in outputs.items()]
    return (f'    {{\n      model_name: "{model}"\n      model_version: -1\n' + "\n".join(maps) + "\n    }")


def ensemble_config(name: str, max_batch_size: int, pre: str, llm: str, post: str) -> str:
    inputs = [_tensor("text_input", "TYPE_STRING", [1]), _tensor("max_tokens", "TYPE_INT32", [1]),
              _tensor("end_id", "TYPE_INT32", [1], optional=True),
              _tensor("pad_id", "TYPE_INT32", [1], optional=True)]
    outputs = [_tensor("text_output", "TYPE_STRING", [-1])]
    steps = [
        _step(pre, {"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "END_ID": "end_id",
                    "PAD_ID": "pad_id"},
              {"INPUT_ID": "_INPUT_ID", "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
               "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN", "OUT_END_ID": "_END_ID", "OUT_PAD_ID": "_PAD_ID"}),
        _step(llm, {"input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN",
                    "request_output_len": "_REQUEST_OUTPUT_LEN", "end_id": "_END_ID", "pad_id": "_PAD_ID"},
              {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"}),
        _step(post, {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
              {"OUTPUT": "text_output"}),
    ]
    return (_header(name, max_batch_size, platform="ensemble") + _tensors("input", inputs)
            + _tensors("output", outputs) + "ensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}\n")


PREPROCESSING_MODEL = '''"""Tokenizes QUERY for the tensorrt_llm model (written by tq_trtllm.trtllm.triton_repo)."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"]["string_value"], local_files_only=True)
        self.end_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end_id

    def execute(self, requests):
        responses = []
        for request in requests:
            queries = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
            out_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy()
            ids = [self.tokenizer.encode(q[0].decode() if isinstance(q[0], bytes) else str(q[0])) for q in queries]
            width = max(len(i) for i in ids)
            padded = np.array([i + [self.pad_id] * (width - len(i)) for i in ids], dtype=np.int32)
            lengths = np.array([[len(i)] for i in ids], dtype=np.int32)
            rows = len(ids)
            end = pb_utils.get_input_tensor_by_name(request, "END_ID")
            pad = pb_utils.get_input_tensor_by_name(request, "PAD_ID")
            end = end.as_numpy() if end is not None else np.full((rows, 1), self.end_id, dtype=np.int32)
            pad = pad.as_numpy() if pad is not None else np.full((rows, 1), self.pad_id, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("INPUT_ID", padded), pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
                pb_utils.Tensor("REQUEST_OUTPUT_LEN", out_len.astype(np.int32)),
                pb_utils.Tensor("OUT_END_ID", end.astype(np.int32)), pb_utils.Tensor("OUT_PAD_ID", pad.astype(np.int32))]))
        return responses
'''

POSTPROCESSING_MODEL = '''"""Detokenizes the tensorrt_llm model's output ids (written by tq_trtllm.trtllm.triton_repo)."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"]["string_value"], local_files_only=True)

    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            texts = [[self.tokenizer.decode(beam[:n], skip_special_tokens=True).encode()
                      for beam, n in zip(batch, lens)] for batch, lens in zip(tokens, lengths)]
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT", np.array(texts, dtype=object))]))
        return responses
'''


def _launch_script(repo: Path, engines: list[tuple[Path, dict]], llm_models: list[str]) -> str:
    """Preloads the plugin, then starts tritonserver (under mpirun, one process per rank, where an
    engine has several tensor-parallel ranks; ranks above 0 serve only the tensorrt_llm models)."""
    preload = library_dir(*engines[0]) / PRELOAD
    world = max(int(m["trtllm"]["tp_size"]) for _, m in engines)
    load = " ".join(f"--load-model={name}" for name in llm_models)
    return f"""#!/usr/bin/env bash
# Starts Triton with TensorRT-LLM's backend on the repository next to this script. The
# QuantizedAttention plugin registers itself when libtq_attention_plugin_preload.so loads, before
# the backend deserializes the engine (docs/PLUGIN.md section 6). Written by tq_trtllm.
set -euo pipefail
REPO="{repo}"
export LD_PRELOAD="{preload}${{LD_PRELOAD:+:$LD_PRELOAD}}"
WORLD={world}
if [[ "$WORLD" == 1 ]]; then
  exec tritonserver --model-repository="$REPO" --disable-auto-complete-config "$@"
fi
if [[ "${{1:-}}" == "--tq-rank" ]]; then
  shift
  RANK="${{OMPI_COMM_WORLD_RANK:?run under mpirun}}"
  if [[ "$RANK" == 0 ]]; then
    exec tritonserver --model-repository="$REPO" --disable-auto-complete-config \\
      --backend-config=python,shm-region-prefix-name=prefix0_ "$@"
  fi
  exec tritonserver --model-repository="$REPO" --disable-auto-complete-config \\
    --backend-config=python,shm-region-prefix-name=prefix${{RANK}}_ --model-control-mode=explicit \\
    {load} --allow-http=false --allow-grpc=false --allow-metrics=false
fi
exec mpirun --allow-run-as-root -n "$WORLD" -x LD_PRELOAD "$0" --tq-rank "$@"
"""


def write_trtllm_repository(engine_dirs: list[Path], repo: Path) -> None:
    """Write the Triton repository `repo` (which must not exist) for `engine_dirs`: one engine ->
    models ensemble, preprocessing, tensorrt_llm, postprocessing; several -> each engine's four
    models prefixed by its directory name (its ensemble named after it). Plus launch_triton.sh."""
    if not engine_dirs:
        raise TQError("give at least one engine directory")
    repo = Path(repo)
    if repo.exists():
        raise TQError(f"{repo} already exists; remove it or choose another repository directory")
    engines = [(Path(e).resolve(), read_trtllm_manifest(e)) for e in engine_dirs]
    names = [p.name for p, _ in engines]
    if len(set(names)) != len(names):
        raise TQError(f"engines {', '.join(map(str, engine_dirs))} share a directory name; rename one")
    if len({int(m["trtllm"]["tp_size"]) for _, m in engines}) != 1:
        raise TQError("one repository serves engines of one tensor-parallel size; write one per size")
    repo.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{repo.name}.", dir=repo.parent))
    try:
        llm_models = []
        for path, manifest in engines:
            prefix = "" if len(engines) == 1 else f"{path.name}_"
            pre, llm, post = f"{prefix}preprocessing", f"{prefix}tensorrt_llm", f"{prefix}postprocessing"
            ens = "ensemble" if len(engines) == 1 else path.name
            batch = int(manifest["trtllm"]["max_batch_size"])
            tokenizer = path / manifest["trtllm"].get("tokenizer", TOKENIZER_DIR)
            files = {f"{pre}/config.pbtxt": preprocessing_config(pre, batch, tokenizer),
                     f"{pre}/1/model.py": PREPROCESSING_MODEL,
                     f"{llm}/config.pbtxt": tensorrt_llm_config(llm, batch, path),
                     f"{post}/config.pbtxt": postprocessing_config(post, batch, tokenizer),
                     f"{post}/1/model.py": POSTPROCESSING_MODEL,
                     f"{ens}/config.pbtxt": ensemble_config(ens, batch, pre, llm, post)}
            for rel, text in files.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_text(text)
            (tmp / llm / "1").mkdir(exist_ok=True)
            (tmp / ens / "1").mkdir(exist_ok=True)
            llm_models.append(llm)
        script = tmp / LAUNCH_SCRIPT
        script.write_text(_launch_script(repo.resolve(), engines, llm_models))
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.rename(tmp, repo)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
