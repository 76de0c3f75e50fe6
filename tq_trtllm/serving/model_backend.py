"""The Triton Python backend model (each model's 1/model.py imports TritonPythonModel from here).

Inputs and outputs follow Triton's LLM backends (TensorRT-LLM, vLLM): text_input, max_tokens,
optional temperature, top_p, seed, stop and stream; text_output. The transaction policy is
decoupled: with stream true a response per piece of text, else one response with the whole text.
Every request goes to the model instance's Scheduler; bad input gets an error response naming the
problem, and the model keeps serving.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from ..core.errors import TQError
from .metrics import ModelMetrics
from .scheduler import Request, Scheduler
from .sequence import Params

DEFAULT_BUDGET = 512 << 20
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _input(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)


def _one(request, name: str, convert, default=None):
    values = _input(request, name)
    if values is None:
        return default
    if values.size != 1:
        raise TQError(f"{name} must hold one value, got {values.size}")
    return convert(values[0])


def _text(value) -> str:
    try:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        raise TQError("a string input is not valid UTF-8") from None


def parse_request(request, tokenizer) -> tuple[list[int], Params]:
    """The prompt's token ids and the options; TQError names what is wrong."""
    from ..cli.run import prompt_ids

    text = _one(request, "text_input", _text, "")
    if not text.strip():
        raise TQError("text_input is empty; send the prompt text")
    max_tokens = _one(request, "max_tokens", int)
    if max_tokens is None or max_tokens <= 0:
        raise TQError(f"max_tokens must be at least 1, got {max_tokens}")
    stops = _input(request, "stop")
    params = Params(max_tokens=max_tokens,
                    temperature=_one(request, "temperature", float, 0.0),
                    top_p=_one(request, "top_p", float, 1.0),
                    seed=_one(request, "seed", int),
                    stop=[_text(s) for s in stops] if stops is not None else [],
                    stream=_one(request, "stream", bool, False))
    if not np.isfinite(params.temperature) or params.temperature < 0:
        raise TQError(f"temperature must be 0 (greedy) or positive, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise TQError(f"top_p must lie in (0, 1], got {params.top_p}")
    return prompt_ids(tokenizer, text, chat=False)[0].tolist(), params


def _response(text: str):
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=object))])


def _error(message: str):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class TritonPythonModel:
    def initialize(self, args):
        from .runner import open_runner

        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        if "engine_dir" not in params:
            raise TQError(f"model {args['model_name']}: config.pbtxt has no engine_dir parameter")
        # a relative engine_dir lies inside the model directory (tq-serve --copy-engines)
        engine_dir = Path(args["model_repository"]) / params["engine_dir"]
        import torch

        device = "cpu"
        if args.get("model_instance_kind") == "GPU":  # then as tq-run --device auto
            torch.cuda.set_device(int(args["model_instance_device_id"]))
            device = "auto"
        else:  # each model instance is a process of its own: oversubscribed cores spin and stall
            torch.set_num_threads(int(params.get("cpu_threads", 1)))
        self.runner = open_runner(str(engine_dir), params.get("cache", "turboquant"), device)
        budget = int(params.get("kv_cache_bytes", DEFAULT_BUDGET))
        self.metrics = ModelMetrics(pb_utils, args["model_name"], self.runner.bytes_per_token(),
                                    self.runner.fp16_bytes_per_token(), budget, self.runner.on_gpu)
        self.scheduler = Scheduler(self.runner, budget, int(params.get("max_active_sequences", 64)),
                                   on_stats=self.metrics.publish)
        self.scheduler.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids, params = parse_request(request, self.runner.tokenizer)
                self.scheduler.submit(Request(ids, params, _emitter(sender),
                                              lambda message, s=sender: s.send(_error(message), flags=FINAL),
                                              sender.is_cancelled))
            except (TQError, ValueError, OverflowError) as err:
                sender.send(_error(str(err)), flags=FINAL)
            except Exception as err:  # whatever it is, this request gets an answer, the rest go on
                sender.send(_error(f"{type(err).__name__}: {err}"), flags=FINAL)
        return None

    def finalize(self):
        self.scheduler.stop()


def _emitter(sender):
    def emit(piece: str | None, final: bool) -> None:
        if piece is None:
            sender.send(flags=FINAL)
        else:
            sender.send(_response(piece), flags=FINAL if final else 0)
    return emit
