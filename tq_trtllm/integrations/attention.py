"""The 'turboquant' attention implementation for transformers models, as the runtime uses it.

The model calls `cache.update` first (TurboQuantCache quantizes the new tokens into its pages and
returns its exact sink tokens, tagged with the layer) and then the registered function, which hands
the call to that layer (TurboQuantLayer.attention): it reads the packed tokens in place
(packed_attention) when the mask is the plain causal one, and otherwise (a padded batch) attends
densely over the cache read back, under the same rule (each token's most recent positions exact,
`layer.exact_recent`). The function itself, its registration and `observe` live below the runtime
(models.attention), where calibration imports them too; this module keeps their import path for
the runtime's callers and holds the runtime's chunk rules. Importing it needs no torch.
"""

from __future__ import annotations

from ..models.attention import (  # noqa: F401  (the runtime's import path for them)
    ATTENTION_NAME,
    observe,
    register,
    turboquant_attention,
    use_turboquant_attention,
)

# how a step's rows read the step's other positions: as computed, or through the cache
CHUNK_READS = ("exact", "cache")
