"""A model's fingerprint: the facts a calibration table depends on, comparable field by field."""

from __future__ import annotations

import hashlib
import json

# Config fields that change the attention activations. Version-dependent bookkeeping
# (transformers_version, dtype, quantization_config, names) is left out so that the same model
# has the same fingerprint under transformers 4.x and 5.x.
ARCHITECTURE_FIELDS = (
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps",
    "attention_bias", "tie_word_embeddings",
)


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_of(config) -> dict:
    """RoPE settings: transformers 4.x keeps rope_theta/rope_scaling, 5.x a rope_parameters dict."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", None) or getattr(config, "rope_theta", None)
    scaling = params or getattr(config, "rope_scaling", None) or {}
    scaling = {k: v for k, v in dict(scaling).items() if k != "rope_type" or v != "default"}
    return {"theta": theta, "scaling": scaling}


def config_hash(config) -> str:
    fields = {name: getattr(config, name, None) for name in ARCHITECTURE_FIELDS}
    fields["head_dim"] = head_dim_of(config)
    fields["rope"] = rope_of(config)
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(family: str, config) -> dict:
    return {
        "family": family,
        "layers": config.num_hidden_layers,
        "heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads,
        "head_dim": head_dim_of(config),
        "config_hash": config_hash(config),
    }


def fingerprint_differences(expected: dict, found: dict) -> list[str]:
    """'name: table has X, model has Y' for every field that differs."""
    return [f"{key}: table has {expected.get(key)!r}, model has {found.get(key)!r}"
            for key in sorted(set(expected) | set(found)) if expected.get(key) != found.get(key)]
