"""The engine directory build_trtllm_engine assembles around TensorRT-LLM's build step: manifest
with its "trtllm" section, the whole table, TensorRT-LLM's config.json with the packed head_size,
one engine per rank, the plugin libraries and the tokenizer, renamed into place at once. The build
step itself (TensorRT-LLM's loader and builder) is stood in by writing what Engine.save writes:
the config the 1.2 builder writes (tests/fixtures/trtllm_1.2_engine_config.json) and a rank file."""

import json
from pathlib import Path

import pytest
import torch

from tq_trtllm.calibration.table import oblivious_table
from tq_trtllm.core.errors import TQError
from tq_trtllm.models.checkpoint import LoadedModel
from tq_trtllm.models.fingerprint import fingerprint
from tq_trtllm.models.registry import get_family
from tq_trtllm.trtllm import builder
from tq_trtllm.trtllm.engine_dir import read_trtllm_manifest
from tq_trtllm.trtllm.plugin_libraries import LIBRARIES

WRITTEN = json.loads((Path(__file__).parent / "fixtures" / "trtllm_1.2_engine_config.json").read_text())[
    "engine_config_as_written_by_the_1.2_builder"]


@pytest.fixture
def loaded():
    from transformers import LlamaConfig, LlamaForCausalLM

    from tq_trtllm.trtllm.check import tiny_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                         num_hidden_layers=2, vocab_size=64)
    return LoadedModel(get_family("llama"), Path("model.gguf"), LlamaForCausalLM(config).eval(), tiny_tokenizer(64))


@pytest.fixture
def stand_in_build(monkeypatch, tmp_path):
    """TensorRT-LLM taken as present; its per-rank build replaced by writing Engine.save's files;
    the plugin libraries stand-in files in $TQ_PLUGIN_DIR."""
    seen = []

    def build_rank(hf_dir, table, opts, rank, rope_args, stage):
        assert (Path(hf_dir) / "config.json").is_file()  # TensorRT-LLM's loader reads a Hugging Face directory
        seen.append((rank, opts.tp_size, rope_args))
        (stage / "config.json").write_text(json.dumps(WRITTEN))
        (stage / f"rank{rank}.engine").write_bytes(b"engine")

    libs = tmp_path / "libs"
    libs.mkdir()
    for name in LIBRARIES:
        (libs / name).write_bytes(name.encode())
    monkeypatch.setenv("TQ_PLUGIN_DIR", str(libs))
    monkeypatch.setattr(builder, "require_tensorrt_llm", lambda what: None)
    monkeypatch.setattr(builder, "register_with_tensorrt", lambda library: None)
    monkeypatch.setattr(builder, "_build_rank", build_rank)
    return seen


def test_the_directory_holds_everything_the_runtimes_need(tmp_path, loaded, stand_in_build):
    table = oblivious_table(fingerprint("llama", loaded.config), 3.0, 3.0)
    out = tmp_path / "engines" / "smol-trt"
    manifest = builder.build_trtllm_engine(out, "llama", None, loaded, table, builder.TrtllmBuildOptions(tp_size=2))
    assert [(r, n) for r, n, _ in stand_in_build] == [(0, 2), (1, 2)]  # one build per rank
    assert stand_in_build[0][2] == {"rope_base": 10000.0, "rope_scaling": "none"}
    assert read_trtllm_manifest(out) == manifest
    section = manifest["trtllm"]
    assert manifest["backend"] == "trtllm" and section["tp_size"] == 2 and section["head_dim"] == 64
    assert section["head_size"] == 13  # 3-bit K and V at head_dim 64: 26 packed bytes per token
    assert json.loads((out / "config.json").read_text())["pretrained_config"]["head_size"] == 13
    assert sorted(p.name for p in (out / "lib").iterdir()) == sorted(LIBRARIES)
    assert (out / "tables.safetensors").is_file() and (out / "tokenizer" / "tokenizer.json").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["smol-trt"]  # no temporary folder left


def test_refusals_leave_nothing_behind(tmp_path, loaded, stand_in_build):
    fp = fingerprint("llama", loaded.config)
    out = tmp_path / "e"
    sinks = oblivious_table(fp, 3.0, 3.0)
    sinks.sink_tokens = 1
    with pytest.raises(TQError, match="--sink-tokens 0"):
        builder.build_trtllm_engine(out, "llama", None, loaded, sinks, builder.TrtllmBuildOptions())
    with pytest.raises(TQError, match="does not divide"):
        builder.build_trtllm_engine(out, "llama", None, loaded, oblivious_table(fp, 3.0, 3.0),
                                    builder.TrtllmBuildOptions(tp_size=4))
    assert not tmp_path.joinpath("e").exists() and stand_in_build == []
    out.mkdir()
    with pytest.raises(TQError, match="already exists"):
        builder.build_trtllm_engine(out, "llama", None, loaded, oblivious_table(fp, 3.0, 3.0),
                                    builder.TrtllmBuildOptions())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "libs"]
