"""The model families whose attention the TurboQuant runtime supports.

A family is supported when its transformers attention module applies RoPE, calls `cache.update` with
post-RoPE keys and values, and then the registered attention function: the cache and attention in
`tq_trtllm.integrations` plug into exactly those two calls. Llama, Mistral and Qwen2 share that code,
and the layout of the attention output projection that the calibration reads (output_projections).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import TQError


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # transformers' config.model_type values of this family
    description: str


FAMILIES = {
    "llama": Family("llama", ("llama",), "Llama 2/3 and SmolLM2 (the default: SmolLM2-135M-Instruct)"),
    "mistral": Family("mistral", ("mistral",), "Mistral (full attention; sliding-window configs refused)"),
    "qwen2": Family("qwen2", ("qwen2",), "Qwen2 / Qwen2.5 (full attention)"),
}


def supported_text() -> str:
    return ", ".join(sorted(FAMILIES))


def get_family(name: str) -> Family:
    family = FAMILIES.get(str(name).strip().lower())
    if family is None:
        raise TQError(f"model family {name!r} is not supported; supported families: {supported_text()}")
    return family


def check_config(family: Family, config) -> None:
    """Refuse a checkpoint whose architecture is not the named family, or uses sliding windows."""
    model_type = getattr(config, "model_type", None)
    if model_type not in family.model_types:
        raise TQError(f"the checkpoint is a {model_type!r} model, not the {family.name!r} family "
                      f"(supported families: {supported_text()})")
    uses_window = getattr(config, "use_sliding_window", model_type == "mistral")
    if uses_window and getattr(config, "sliding_window", None):
        raise TQError(f"the checkpoint uses sliding-window attention (window {config.sliding_window}); "
                      "the TurboQuant cache supports full attention only")


def output_projections(model) -> list:
    """Every layer's attention output projection weight, [hidden, q_heads * head_dim]."""
    return [layer.self_attn.o_proj.weight for layer in model.model.layers]


def rotary_frequencies(model) -> torch.Tensor:
    """The inverse frequencies of the model's rotate-half RoPE, float64 [head_dim / 2], radians per
    position (what transformers' rotary embedding computed, after any frequency scaling)."""
    rotary = getattr(model.model, "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        raise TQError("the model has no rotary embedding with inverse frequencies (model.model."
                      "rotary_emb.inv_freq), which the calibration needs to relate its statistics "
                      "to positions; use --oblivious (no calibration)")
    if float(getattr(rotary, "attention_scaling", 1.0)) != 1.0:
        raise TQError("the model's RoPE scales cos and sin (attention_scaling != 1), which the "
                      "calibration's statistics do not model; use --oblivious (no calibration)")
    import torch  # here, not at import: the command-line tools' --help stays torch-free

    return rotary.inv_freq.detach().to("cpu", torch.float64)
