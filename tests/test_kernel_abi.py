"""The C ABI's contract where it needs no GPU (plugin_cpp/include/tq/tq_kernels.h): the packed
format versions the library reads, the refusal of any other when the binding loads it, the C ABI
version, and tq_last_error kept per host thread. The library loads on a CPU machine once built."""

import re
import threading
from pathlib import Path

import pytest

from required import REQUIRE_CUDA_BUILD, needs
from tq_trtllm import kernels
from tq_trtllm.core.errors import TQError
from tq_trtllm.core.spec import FORMAT_VERSION, READABLE_FORMAT_VERSIONS
from tq_trtllm.kernels import _lib

pytestmark = needs(None if kernels.find_library() else "libtq_kernels.so is not built",
                   REQUIRE_CUDA_BUILD)

TQ_ERR_FORMAT_VERSION = 9


def test_library_reads_exactly_the_references_format_versions():
    """tq_check_format_version accepts the versions the Python reference reads and refuses every
    other with TQ_ERR_FORMAT_VERSION and a message that names it and the readable range."""
    lib = kernels.library()
    first, last = min(READABLE_FORMAT_VERSIONS), max(READABLE_FORMAT_VERSIONS)
    assert list(READABLE_FORMAT_VERSIONS) == list(range(first, last + 1)) and last == FORMAT_VERSION
    for version in (-1, 0, 1, *READABLE_FORMAT_VERSIONS, FORMAT_VERSION + 1, FORMAT_VERSION + 2, 2**31 - 1):
        status = lib.tq_check_format_version(version)
        if version in READABLE_FORMAT_VERSIONS:
            assert status == 0, (version, lib.tq_last_error())
        else:
            assert status == TQ_ERR_FORMAT_VERSION, version
            message = lib.tq_last_error().decode()
            assert f"format version {version} is not readable" in message, message
            assert f"reads versions {first} to {last}" in message, message


def refused_on_load(monkeypatch, name: str, value: int, match: str) -> None:
    """The binding with its `name` set to `value` refuses the built library when it loads it, with
    a TQError matching `match`; afterwards the binding is as it was and loads the library again."""
    monkeypatch.setattr(_lib, name, value)
    _lib.library.cache_clear()
    try:
        with pytest.raises(TQError, match=match):
            _lib.library()
    finally:
        monkeypatch.undo()
        _lib.library.cache_clear()


def test_a_library_of_another_format_version_is_refused_when_loaded(monkeypatch):
    """The binding asks the library, on loading, whether it reads the package's format version: a
    package of another version gets TQError naming the version, never a library that misreads."""
    refused_on_load(monkeypatch, "FORMAT_VERSION", FORMAT_VERSION + 1,
                    rf"tq_check_format_version failed \(status 9\): packed cache format version "
                    rf"{FORMAT_VERSION + 1} is not readable")
    assert _lib.library().tq_check_format_version(FORMAT_VERSION) == 0


def test_a_library_of_another_abi_version_is_refused_when_loaded(monkeypatch):
    """The binding declares the C ABI of tq_kernels.h's TQ_ABI_VERSION (the attention's plan and
    run, their structs, tq_codec_init): a library of another version is refused with a message
    that says to rebuild it, never called through mismatched signatures."""
    assert kernels.library().tq_abi_version() == _lib.ABI_VERSION == _header_abi_version()
    abi = _lib.ABI_VERSION
    refused_on_load(monkeypatch, "ABI_VERSION", abi + 1,
                    rf"has C ABI version {abi}, this package needs {abi + 1}; rebuild it")


def _header_abi_version() -> int:
    header = Path(__file__).resolve().parents[1] / "plugin_cpp" / "include" / "tq" / "tq_kernels.h"
    return int(re.search(r"^#define TQ_ABI_VERSION (\d+)", header.read_text(), re.M).group(1))


def test_last_error_is_kept_per_host_thread():
    """Two threads fail in turn (the calls release the GIL; barriers order them): each then reads
    its own message, not the other's, and a thread that has not failed reads an empty one."""
    lib = kernels.library()
    turns = [threading.Barrier(2, timeout=30) for _ in range(3)]
    seen = {}

    def worker(name, version):
        turns[0].wait()
        if name == "first":
            assert lib.tq_check_format_version(version) == TQ_ERR_FORMAT_VERSION
        turns[1].wait()
        if name == "second":
            assert lib.tq_check_format_version(version) == TQ_ERR_FORMAT_VERSION
        turns[2].wait()
        seen[name] = lib.tq_last_error().decode()

    threads = [threading.Thread(target=worker, args=args) for args in (("first", 101), ("second", 202))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert seen["first"].startswith("packed cache format version 101 "), seen
    assert seen["second"].startswith("packed cache format version 202 "), seen
    fresh = []
    thread = threading.Thread(target=lambda: fresh.append(lib.tq_last_error().decode()))
    thread.start()
    thread.join(timeout=30)
    assert fresh == [""]
