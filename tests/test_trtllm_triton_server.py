"""The generated repository's Python models on a real Triton server (the tritonserver of
nvidia-pytriton, on 127.0.0.1): preprocessing and postprocessing load from the configs
write_trtllm_repository wrote and turn text into the engine tokenizer's ids and back. The
tensorrt_llm model and the ensemble need TensorRT-LLM's backend (docs/TRTLLM.md, section 7)."""

import json
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


def test_pre_and_postprocessing_serve_the_engines_tokenizer(tmp_path):
    from test_trtllm_triton_repo import fake_engine

    from tq_trtllm.trtllm.check import tiny_tokenizer
    from tq_trtllm.trtllm.triton_repo import write_trtllm_repository

    engine = fake_engine(tmp_path / "engine")
    tokenizer = tiny_tokenizer(64)
    tokenizer.save_pretrained(engine / "tokenizer")
    repo = tmp_path / "repo"
    write_trtllm_repository([engine], repo)
    ports = launcher.Ports(_free_port(), _free_port(), _free_port())
    models = ["preprocessing", "postprocessing"]
    proc = launcher.start_server(repo, ports, models=models, log=tmp_path / "server.log")
    try:
        launcher.wait_ready(proc, "127.0.0.1", ports, timeout=180, models=models)
        base = f"http://127.0.0.1:{ports.http}"
        pre = _infer(base, "preprocessing", [
            {"name": "QUERY", "shape": [1, 1], "datatype": "BYTES", "data": ["t5 t7 t9"]},
            {"name": "REQUEST_OUTPUT_LEN", "shape": [1, 1], "datatype": "INT32", "data": [4]}])
        assert pre["INPUT_ID"]["data"] == tokenizer.encode("t5 t7 t9") == [5, 7, 9]
        assert pre["REQUEST_INPUT_LEN"]["data"] == [3] and pre["REQUEST_OUTPUT_LEN"]["data"] == [4]
        assert pre["OUT_END_ID"]["data"] == [tokenizer.eos_token_id]
        post = _infer(base, "postprocessing", [
            {"name": "TOKENS_BATCH", "shape": [1, 1, 4], "datatype": "INT32", "data": [11, 12, 13, 14]},
            {"name": "SEQUENCE_LENGTH", "shape": [1, 1], "datatype": "INT32", "data": [3]}])
        assert post["OUTPUT"]["data"] == ["t11 t12 t13"]
    except Exception:
        print((tmp_path / "server.log").read_text()[-4000:])
        raise
    finally:
        launcher.stop_server(proc)
