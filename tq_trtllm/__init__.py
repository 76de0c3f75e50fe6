"""tq_trtllm: a 3-bit TurboQuant KV cache for LLM inference on NVIDIA Hopper."""

__version__ = "0.1.0"
