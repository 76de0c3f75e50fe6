"""tq-serve: write a Triton model repository for engines and serve it with tritonserver."""

from __future__ import annotations

import signal
from pathlib import Path

import click

from ..core.errors import TQError
from .common import clean_errors


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def write_trtllm(engines: list[Path], repo: Path) -> None:
    try:
        from ..trtllm.triton_repo import write_trtllm_repository
    except ImportError as err:
        raise TQError(f"--backend trtllm cannot write a repository here: {err}") from None
    write_trtllm_repository(engines, repo)


@click.command(help="Serve engines through Triton Inference Server: writes a model repository (one "
                    "model per engine plus an FP16-cache baseline of the same checkpoint) and runs "
                    "tritonserver on it. docs/SERVING.md is the guide.")
@click.option("--engine", "engines", type=click.Path(path_type=Path), multiple=True, required=True,
              help="Engine directory (tq-build); repeat for more models.")
@click.option("--repo", type=click.Path(path_type=Path), default=Path("triton-repo"), show_default=True,
              help="Model repository to write (replaced only if tq-serve wrote it).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="HTTP port.")
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=8001, show_default=True)
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=8002, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Address the server listens on (0.0.0.0: every interface).")
@click.option("--backend", type=click.Choice(["python", "trtllm"]), default="python", show_default=True,
              help="python: tq_trtllm's model on Triton's Python backend; trtllm: a repository for "
                   "TensorRT-LLM engines (Triton's TensorRT-LLM backend).")
@click.option("--kv-cache-mib", type=click.IntRange(1), default=512, show_default=True,
              help="KV cache budget of each model instance; requests wait for pages beyond it.")
@click.option("--max-active", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="Most sequences in one decode batch.")
@click.option("--instances-per-gpu", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Model instances on every GPU (instance_group KIND_GPU count); one on a CPU.")
@click.option("--cpu-threads", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Torch threads of each model instance on a CPU (each instance is a process).")
@click.option("--copy-engines", is_flag=True,
              help="Copy each engine into its model directory (a self-contained repository).")
@click.option("--write-only", is_flag=True, help="Only write the repository.")
@click.option("--timeout", type=click.IntRange(1), default=600, show_default=True,
              help="Seconds to wait for the server and its models to be ready.")
@clean_errors
def main(engines, repo, port, grpc_port, metrics_port, address, backend, kv_cache_mib, max_active,
         instances_per_gpu, cpu_threads, copy_engines, write_only, timeout):
    from ..serving import launcher

    if backend == "trtllm":
        write_trtllm(list(engines), repo)
        models = None
    else:
        from ..serving.repository import write_repository

        entries = write_repository(list(engines), repo, kv_cache_mib << 20, instances=instances_per_gpu,
                                   max_active=max_active, copy_engines=copy_engines,
                                   cpu_threads=cpu_threads)
        models = [e.name for e in entries]
    click.echo(f"repository: {repo.resolve()}" + (f" (models: {', '.join(models)})" if models else ""))
    if write_only:
        return
    ports = launcher.Ports(port, grpc_port, metrics_port)
    # the server runs in its own process group: a SIGTERM to tq-serve (a service manager's stop)
    # must stop it as Ctrl-C does
    signal.signal(signal.SIGTERM, _interrupt)
    proc = launcher.start_server(repo, ports, address)
    try:
        launcher.wait_ready(proc, address, ports, timeout, models or ())
        click.echo(f"serving: http://{address}:{port} (generate: POST /v2/models/NAME/generate), "
                   f"gRPC {address}:{grpc_port}, metrics http://{address}:{metrics_port}/metrics; "
                   "Ctrl-C stops it")
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        launcher.stop_server(proc)
    if proc.returncode not in (0, -signal.SIGTERM, None):
        raise TQError(f"tritonserver exited with status {proc.returncode}")


if __name__ == "__main__":
    main()
