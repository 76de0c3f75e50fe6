"""The Triton repository for TensorRT-LLM's backend (tq_trtllm/trtllm/triton_repo.py): every
config.pbtxt parsed with Triton's own model-config schema (tritonclient's generated protobuf
module), the ensemble's wiring checked against the models it names, and the launch script."""

import json
import py_compile
import subprocess
from pathlib import Path

import pytest

from tq_trtllm.calibration.table import oblivious_table
from tq_trtllm.core.errors import TQError
from tq_trtllm.engine import write_engine
from tq_trtllm.trtllm.engine_dir import read_trtllm_manifest
from tq_trtllm.trtllm.triton_repo import LAUNCH_SCRIPT, write_trtllm_repository

from required import needs

try:  # Triton's model-config schema, generated protobuf (tritonclient, the serve extra)
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2
    MISSING_SCHEMA = None
except ImportError:
    MISSING_SCHEMA = "tritonclient is not installed (pip install -e '.[serve]')"

# TQ_REQUIRE_SERVE=1 (CI) turns the skip into a failure: the configs must be checked there
pytestmark = needs(MISSING_SCHEMA, "TQ_REQUIRE_SERVE")

FP = {"family": "llama", "layers": 2, "heads": 8, "kv_heads": 4, "head_dim": 128, "config_hash": "0123456789abcdef"}


def fake_engine(directory: Path, tp: int = 1) -> Path:
    """An engine directory as tq-build --backend trtllm lays it out (the rank engines and
    libraries are stand-in files: the repository only points at them)."""
    write_engine(directory, "llama", None, "trtllm", oblivious_table(FP, 3.0, 3.0))
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["trtllm"] = {"tp_size": tp, "max_batch_size": 4, "max_seq_len": 256, "head_size": 25,
                          "head_dim": 128, "tokens_per_block": 32, "libraries": "lib", "tokenizer": "tokenizer"}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    (directory / "config.json").write_text("{}")
    for r in range(tp):
        (directory / f"rank{r}.engine").write_bytes(b"\0")
    (directory / "lib").mkdir()
    (directory / "tokenizer").mkdir()
    return directory


def parse(path: Path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_every_config_parses_with_tritons_schema(tmp_path):
    engine = fake_engine(tmp_path / "smol-kv3")
    repo = tmp_path / "repo"
    write_trtllm_repository([engine], repo)
    configs = {p.parent.name: parse(p) for p in repo.glob("*/config.pbtxt")}
    assert set(configs) == {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing"}
    llm = configs["tensorrt_llm"]
    assert llm.backend == "tensorrtllm" and llm.max_batch_size == 4
    params = {k: v.string_value for k, v in llm.parameters.items()}
    assert params["gpt_model_path"] == str(engine.resolve())
    assert params["gpt_model_type"] == "inflight_fused_batching" and params["max_beam_width"] == "1"
    assert params["enable_kv_cache_reuse"] == "false" and params["enable_chunked_context"] == "false"
    for name in ("preprocessing", "postprocessing"):
        assert configs[name].backend == "python"
        assert configs[name].parameters["tokenizer_dir"].string_value == str(engine.resolve() / "tokenizer")
        py_compile.compile(str(repo / name / "1" / "model.py"), doraise=True)
    assert (repo / "tensorrt_llm" / "1").is_dir() and (repo / "ensemble" / "1").is_dir()


def test_the_ensemble_wires_existing_tensors(tmp_path):
    write_trtllm_repository([fake_engine(tmp_path / "e")], tmp_path / "repo")
    configs = {p.parent.name: parse(p) for p in (tmp_path / "repo").glob("*/config.pbtxt")}
    ens = configs["ensemble"]
    assert ens.platform == "ensemble"
    produced = {t.name for t in ens.input}
    for step in ens.ensemble_scheduling.step:
        model = configs[step.model_name]
        inputs, outputs = {t.name: t for t in model.input}, {t.name for t in model.output}
        assert set(step.input_map) <= set(inputs), step.model_name
        assert all(inputs[k].optional or v in produced for k, v in step.input_map.items()), step.model_name
        assert set(step.output_map) <= outputs, step.model_name
        missing_required = {k for k, t in inputs.items() if not t.optional} - set(step.input_map)
        assert not missing_required, (step.model_name, missing_required)
        produced |= set(step.output_map.values())
    assert {t.name for t in ens.output} <= produced


def test_launch_script_preloads_the_plugin(tmp_path):
    engine = fake_engine(tmp_path / "e")
    write_trtllm_repository([engine], tmp_path / "repo")
    script = tmp_path / "repo" / LAUNCH_SCRIPT
    text = script.read_text()
    assert f'LD_PRELOAD="{engine.resolve()}/lib/libtq_attention_plugin_preload.so' in text
    assert "tritonserver --model-repository=" in text and script.stat().st_mode & 0o111
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_tensor_parallel_engines_launch_one_server_per_rank(tmp_path):
    engines = [fake_engine(tmp_path / "a", tp=2), fake_engine(tmp_path / "b", tp=2)]
    write_trtllm_repository(engines, tmp_path / "repo")
    names = {p.parent.name for p in (tmp_path / "repo").glob("*/config.pbtxt")}
    assert names == {"a", "a_preprocessing", "a_tensorrt_llm", "a_postprocessing",
                     "b", "b_preprocessing", "b_tensorrt_llm", "b_postprocessing"}
    for p in (tmp_path / "repo").glob("*/config.pbtxt"):
        parse(p)
    text = (tmp_path / "repo" / LAUNCH_SCRIPT).read_text()
    assert "mpirun" in text and "WORLD=2" in text and "--load-model=a_tensorrt_llm --load-model=b_tensorrt_llm" in text


def test_bad_input_is_refused(tmp_path):
    engine = fake_engine(tmp_path / "e")
    (tmp_path / "repo").mkdir()
    with pytest.raises(TQError, match="already exists"):
        write_trtllm_repository([engine], tmp_path / "repo")
    hf = tmp_path / "hf-engine"
    write_engine(hf, "llama", None, "hf", oblivious_table(FP, 3.0, 3.0))
    with pytest.raises(TQError, match="'hf' engine"):
        write_trtllm_repository([hf], tmp_path / "repo2")
    (engine / "rank0.engine").unlink()
    with pytest.raises(TQError, match="rank0.engine"):
        read_trtllm_manifest(engine)
    assert not (tmp_path / "repo2").exists()
