"""Serving through Triton Inference Server: a model repository generator (repository), the
server's launcher (launcher), the Python backend model (model_backend) over a continuous-batching
scheduler (scheduler, rows, sequence) and its metrics (metrics). docs/SERVING.md is the guide."""
