"""The runtime's backends (integrations.backends): chosen once per layer, refused clearly where they
cannot run, and the layering that keeps calibration and the reference below the runtime."""

import ast
from pathlib import Path

import pytest
import torch

from hf_fixtures import tiny_model
from tq_trtllm.calibration.table import oblivious_table
from tq_trtllm.core.errors import TQError
from tq_trtllm.integrations import cache as cache_module
from tq_trtllm.integrations.attention import use_turboquant_attention
from tq_trtllm.integrations.backends import ReferenceBackend, choose_backend
from tq_trtllm.integrations.cache import TurboQuantCache
from tq_trtllm.models.fingerprint import fingerprint

pytest.importorskip("transformers")

PACKAGE = Path(__file__).resolve().parents[1] / "tq_trtllm"
# the packages below the transformers runtime: none may import it
LOWER = ("core", "calibration", "models")


def test_every_layer_chooses_its_backend_once_and_keeps_it(monkeypatch, gen):
    model = tiny_model()
    use_turboquant_attention(model)
    chosen = []

    def counted(*args):
        chosen.append(choose_backend(*args))
        return chosen[-1]

    monkeypatch.setattr(cache_module, "choose_backend", counted)
    cache = TurboQuantCache(oblivious_table(fingerprint("llama", model.config), 3, 3))
    ids = torch.randint(4, 60, (1, 40), generator=gen)  # the pages grow past their first blocks
    with torch.inference_mode():
        for a, b in ((0, 20), (20, 21), (21, 22), (22, 40)):
            model(input_ids=ids[:, a:b], past_key_values=cache, use_cache=True)
    assert len(chosen) == 2  # one choice per layer, at its first update, none per step
    assert [layer.pages_backend for layer in cache.layers] == chosen
    assert all(type(b) is ReferenceBackend and b.layer is layer
               for b, layer in zip(chosen, cache.layers))
    assert not any(layer.uses_kernels for layer in cache.layers)
    cache.layers[0].reset()  # a reset layer chooses again at its next update
    assert cache.layers[0].pages_backend is None


def test_the_choice_follows_the_backend_argument_and_refuses_kernels_it_cannot_run():
    x = torch.zeros(1, 2, 1, 64, dtype=torch.float16)  # CPU tensors: no kernels here
    assert type(choose_backend("auto", None, x)) is ReferenceBackend
    assert type(choose_backend("reference", None, x)) is ReferenceBackend
    with pytest.raises(TQError, match="^the kernel backend cannot run here: "):
        choose_backend("kernels", None, x)


def imported_modules(source: str, package: str) -> set[str]:
    """Every module that source (a module of `package`) imports, anywhere in it (function bodies
    too), as absolute names; `from P import x` counts as P and as P.x (x may be a module)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def package_of(path: Path) -> str:
    """tq_trtllm/calibration/capture.py and tq_trtllm/calibration/__init__.py: tq_trtllm.calibration."""
    return ".".join(path.relative_to(PACKAGE.parent).parts[:-1])


def is_runtime(name: str) -> bool:
    return name == "tq_trtllm.integrations" or name.startswith("tq_trtllm.integrations.")


def test_calibration_and_the_reference_do_not_import_the_runtime():
    files = [p for sub in LOWER for p in sorted((PACKAGE / sub).rglob("*.py"))]
    assert len(files) > 20
    upward = sorted(f"{p.relative_to(PACKAGE.parent)}: {name}" for p in files
                    for name in imported_modules(p.read_text(), package_of(p)) if is_runtime(name))
    assert not upward, f"modules below the runtime import it: {upward}"


def test_the_import_check_sees_relative_absolute_and_nested_imports():
    calibration = "tq_trtllm.calibration"
    for source in ("from ..integrations.cache import X\n", "def f():\n    from .. import integrations\n",
                   "import tq_trtllm.integrations.attention\n"):
        assert any(map(is_runtime, imported_modules(source, calibration))), source
    assert not any(map(is_runtime, imported_modules("from ..models.attention import observe\n"
                                                    "from . import table\n", calibration)))
