"""Running Triton Inference Server on a repository: the `tritonserver` binary that the
nvidia-pytriton wheel ships (or one on PATH, as in NVIDIA's container), its Python backend with the
stub built for this Python, and the environment the stub needs (the wheel's libraries, libpython,
this virtual environment first on PATH so the stub imports numpy, torch and tq_trtllm)."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import TQError

INSTALL = "pip install 'tq-trtllm[serve]' (nvidia-pytriton ships tritonserver)"


@dataclass
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002


@dataclass
class Server:
    bundled: Path | None  # the nvidia-pytriton package's tritonserver folder, or None (PATH)
    binary: Path


def find_server() -> Server:
    spec = importlib.util.find_spec("pytriton")
    if spec is not None and spec.origin is not None:
        root = Path(spec.origin).parent / "tritonserver"
        if (root / "bin" / "tritonserver").is_file():
            return Server(root, root / "bin" / "tritonserver")
    found = shutil.which("tritonserver")
    if found:
        return Server(None, Path(found))
    raise TQError(f"no tritonserver found: {INSTALL}, or put NVIDIA's tritonserver on PATH")


def backend_directory(server: Server) -> Path | None:
    """The bundled Python backend with the stub for this Python, as links in a per-user cache
    folder (the wheel keeps one stub per Python version beside the backend); None for a server
    from PATH, which has its own backends."""
    if server.bundled is None:
        return None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server.bundled / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise TQError(f"nvidia-pytriton has no Python backend stub for Python {version}; "
                      "use Python 3.8-3.13")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    folder = cache / "tq_trtllm" / f"triton-backends-py{version}"
    python = folder / "python"
    python.mkdir(parents=True, exist_ok=True)
    sources = {"triton_python_backend_stub": stub,
               **{p.name: p for p in (server.bundled / "backends" / "python").iterdir() if p.is_file()}}
    for name, source in sources.items():
        link = python / name
        if not (link.is_symlink() and link.resolve() == source.resolve()):
            tmp = python / f".{name}.tmp"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(source)
            os.replace(tmp, link)
    return folder


def server_env(server: Server) -> dict:
    env = dict(os.environ)
    libs = [str(sysconfig.get_config_var("LIBDIR") or "")]
    if server.bundled is not None:
        libs.insert(0, str(server.bundled.parent.parent / "nvidia_pytriton.libs"))
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    # the stub's embedded Python finds this environment through the python first on PATH
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("TQDM_DISABLE", "1")  # no loading bars in the server's log
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    return env


def server_command(server: Server, repo: Path, ports: Ports, address: str = "127.0.0.1",
                   models: list[str] | None = None, shm_prefix: str = "tq_") -> list[str]:
    """Explicit model control: every model (or `models`) loads at start, and the repository API can
    load or unload one later without touching the others. /v2/health/ready is the server's own
    readiness: a model that fails to load does not take the others' server out of service (each
    model's readiness is /v2/models/NAME/ready)."""
    cmd = [str(server.binary), f"--model-repository={repo}", "--model-control-mode=explicit",
           "--strict-readiness=false",
           *[f"--load-model={m}" for m in (models or ["*"])],
           f"--http-port={ports.http}", f"--grpc-port={ports.grpc}", f"--metrics-port={ports.metrics}",
           f"--http-address={address}", f"--grpc-address={address}", f"--metrics-address={address}",
           # shared-memory names of this server's Python stubs, apart from any other server's
           f"--backend-config=python,shm-region-prefix-name={shm_prefix}"]
    backends = backend_directory(server)
    if backends is not None:
        cmd.append(f"--backend-directory={backends}")
    return cmd


def start_server(repo: Path, ports: Ports, address: str = "127.0.0.1", models: list[str] | None = None,
                 log: Path | None = None) -> subprocess.Popen:
    """Start tritonserver in its own process group (its Python stubs are its children)."""
    server = find_server()
    shm_prefix = f"tq_{secrets.token_hex(4)}_"
    out = open(log, "ab") if log else None
    try:
        proc = subprocess.Popen(server_command(server, Path(repo).resolve(), ports, address, models,
                                               shm_prefix),
                                env=server_env(server), stdout=out, stderr=subprocess.STDOUT if out else None,
                                start_new_session=True)
    finally:
        if out:
            out.close()
    proc.shm_prefix = shm_prefix  # what stop_server removes if the server could not
    return proc


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_ready(proc: subprocess.Popen, address: str, ports: Ports, timeout: float,
               models: list[str] = ()) -> None:
    """Until /v2/health/ready (and each model's ready) answers 200; TQError if the server exits or
    the time runs out."""
    base = f"http://{address}:{ports.http}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TQError(f"tritonserver exited with status {proc.returncode} before it was ready "
                          "(its log says why)")
        try:
            if all(http_get(base + path, 2.0)[0] == 200
                   for path in ["/v2/health/ready", *[f"/v2/models/{m}/ready" for m in models]]):
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise TQError(f"tritonserver was not ready at {base} within {timeout:.0f} s")


def stop_server(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM to the server's process group, SIGKILL if it has not exited in `timeout`."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass
    else:
        try:  # stubs left behind by a killed server
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    # the shared memory of a server that was killed (a clean exit leaves none)
    for region in Path("/dev/shm").glob(f"{getattr(proc, 'shm_prefix', None) or '-'}*"):
        region.unlink(missing_ok=True)


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def model_index(address: str, ports: Ports) -> list[dict]:
    """The repository index: every model's name, state and load error."""
    request = urllib.request.Request(f"http://{address}:{ports.http}/v2/repository/index", data=b"{}",
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())
