"""The TensorRT-LLM 1.2 engine path (docs/TRTLLM.md): TensorRT-LLM's Llama with each layer's attention
replaced by the QuantizedAttention plugin, the calibration tables baked into the engine.

Only the modules that build or run engines import tensorrt_llm, and only inside functions: the rank
slicing, the config writing, the engine directory and the Triton repository are plain Python and
work (and are tested) where TensorRT-LLM is not installed.
"""
