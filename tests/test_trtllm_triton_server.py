"""The generated repository on a real Triton server (the tritonserver of nvidia-pytriton, on
127.0.0.1). preprocessing and postprocessing load from the configs write_trtllm_repository wrote
and turn text into the engine tokenizer's ids and back. The ensemble loads with Triton's own
validation of its wiring against its members' configs; for that, and only for that, the
tensorrt_llm model (which needs TensorRT-LLM's backend and a GPU, docs/TRTLLM.md section 7) is
stood in by a Python model with exactly its inputs and outputs that echoes the prompt's ids."""

import json
import re
import socket
import urllib.request

import pytest

from required import needs

try:
    from tq_trtllm.serving import launcher
    MISSING = None if launcher.find_server() else "no tritonserver"
except Exception as err:  # noqa: BLE001 - any reason the server cannot start is the skip's reason
    launcher, MISSING = None, f"no Triton server to start here ({type(err).__name__}: {err})"

pytestmark = needs(MISSING, "TQ_REQUIRE_SERVE")

ECHO_LLM = '''"""Stand-in for TensorRT-LLM's backend in a test: output_ids = the prompt's ids (beam 1)."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "input_lengths").as_numpy().reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("output_ids", ids[:, None, :].astype(np.int32)),
                pb_utils.Tensor("sequence_length", lengths.astype(np.int32))]))
        return responses
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _infer(base: str, model: str, inputs: list[dict]) -> dict:
    body = json.dumps({"inputs": inputs}).encode()
    request = urllib.request.Request(f"{base}/v2/models/{model}/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return {o["name"]: o for o in json.loads(reply.read())["outputs"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from test_trtllm_triton_repo import fake_engine

    from tq_trtllm.trtllm.check import tiny_tokenizer
    from tq_trtllm.trtllm.triton_repo import write_trtllm_repository

    tmp = tmp_path_factory.mktemp("triton")
    engine = fake_engine(tmp / "engine")
    tokenizer = tiny_tokenizer(64)
    tokenizer.save_pretrained(engine / "tokenizer")
    repo = tmp / "repo"
    write_trtllm_repository([engine], repo)
    llm = repo / "tensorrt_llm"
    config = llm / "config.pbtxt"
    config.write_text(re.sub(r'backend: "tensorrtllm"', 'backend: "python"', config.read_text()))
    (llm / "1" / "model.py").write_text(ECHO_LLM)
    ports = launcher.Ports(_free_port(), _free_port(), _free_port())
    models = ["preprocessing", "postprocessing", "tensorrt_llm", "ensemble"]
    log = tmp / "server.log"
    proc = launcher.start_server(repo, ports, models=models, log=log)
    try:
        launcher.wait_ready(proc, "127.0.0.1", ports, timeout=180, models=models)
    except Exception:
        launcher.stop_server(proc)
        print(log.read_text()[-4000:])
        raise
    yield f"http://127.0.0.1:{ports.http}", tokenizer
    launcher.stop_server(proc)


def test_preprocessing_tokenizes_with_the_engines_tokenizer(server):
    base, tokenizer = server
    pre = _infer(base, "preprocessing", [
        {"name": "QUERY", "shape": [1, 1], "datatype": "BYTES", "data": ["t5 t7 t9"]},
        {"name": "REQUEST_OUTPUT_LEN", "shape": [1, 1], "datatype": "INT32", "data": [4]}])
    assert pre["INPUT_ID"]["data"] == tokenizer.encode("t5 t7 t9") == [5, 7, 9]
    assert pre["REQUEST_INPUT_LEN"]["data"] == [3] and pre["REQUEST_OUTPUT_LEN"]["data"] == [4]
    assert pre["OUT_END_ID"]["data"] == [tokenizer.eos_token_id]


def test_postprocessing_detokenizes_up_to_the_sequence_length(server):
    base, _ = server
    post = _infer(base, "postprocessing", [
        {"name": "TOKENS_BATCH", "shape": [1, 1, 4], "datatype": "INT32", "data": [11, 12, 13, 14]},
        {"name": "SEQUENCE_LENGTH", "shape": [1, 1], "datatype": "INT32", "data": [3]}])
    assert post["OUTPUT"]["data"] == ["t11 t12 t13"]


def test_the_ensemble_carries_text_through_the_three_models(server):
    base, _ = server
    out = _infer(base, "ensemble", [
        {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": ["t20 t21 t22 t23"]},
        {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [8]}])
    assert out["text_output"]["data"] == ["t20 t21 t22 t23"]  # the stand-in echoes the prompt
