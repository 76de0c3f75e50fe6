"""The TensorRT side of tq_trtllm: what a builder hands the QuantizedAttention plugin (docs/PLUGIN.md)."""
