"""The transformers runtime: a Cache that holds the packed TurboQuant pages, and the attention
function registered through transformers' AttentionInterface that the model calls on it."""
