"""English prose for evaluation: Jane Austen's six novels (public domain) from the Debian package
r-cran-janeaustenr, read straight from its R data file without R.

The package stores each novel as an R character vector (one element per printed line) in a lazy-load
database: data/Rdata.rdx (gzip) indexes data/Rdata.rdb, whose entries are a 4-byte length and a zlib
stream of R's XDR serialization. `build_scripts/fetch_corpus.sh` unpacks the package into ./.corpus
when it is not installed system-wide.
"""

from __future__ import annotations

import gzip
import os
import re
import struct
import sys
import zlib
from pathlib import Path

from ..core.errors import TQError

BOOKS = ("emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility")
CALIBRATION_BOOK = "emma"  # calibration text; evaluation uses another book, held out
EVALUATION_BOOK = "prideprejudice"
PACKAGE_DATA = "usr/lib/R/site-library/janeaustenr/data"


def _data_dir() -> Path:
    roots = [os.environ.get("TQ_CORPUS_DIR"), Path(__file__).resolve().parents[2] / ".corpus", "/"]
    for root in roots:
        if root and (Path(root) / PACKAGE_DATA / "Rdata.rdb").is_file():
            return Path(root) / PACKAGE_DATA
    raise TQError("Jane Austen's novels were not found: run build_scripts/fetch_corpus.sh (unpacks the "
                  "Debian package r-cran-janeaustenr into ./.corpus) or apt-get install r-cran-janeaustenr")


def _index(data: Path) -> dict[str, tuple[int, int]]:
    """name -> (offset, length) in Rdata.rdb, from the gzip-compressed XDR index."""
    raw = gzip.decompress((data / "Rdata.rdx").read_bytes())
    # each entry is an INTSXP of length 2: header 0x0000000d, length 2, offset, size
    spans = [struct.unpack(">ii", m.group(1))
             for m in re.finditer(rb"\x00\x00\x00\x0d\x00\x00\x00\x02(.{8})", raw, re.S)]
    names = [n.decode() for n in re.findall(rb"\x00\x04\x00\x09\x00\x00\x00.([a-z]+)", raw, re.S)]
    books = [n for n in names if n in BOOKS]
    if len(books) != len(BOOKS) or len(spans) < len(BOOKS):
        raise TQError(f"unexpected layout of {data / 'Rdata.rdx'}")
    return dict(zip(books, spans))


def _strings(blob: bytes) -> list[str]:
    """The elements of a serialized R character vector."""
    payload = zlib.decompress(blob[4:])
    if payload[:2] != b"X\n":
        raise TQError("the novel's data is not R XDR serialization")
    version = struct.unpack(">i", payload[2:6])[0]
    pos = 14
    if version == 3:  # native encoding name follows
        pos += 4 + struct.unpack(">i", payload[pos:pos + 4])[0]
    flags, count = struct.unpack(">ii", payload[pos:pos + 8])
    if flags & 0xFF != 16:
        raise TQError("the novel's data is not a character vector")
    pos += 8
    lines = []
    for _ in range(count):
        length = struct.unpack(">i", payload[pos + 4:pos + 8])[0]
        pos += 8
        if length < 0:  # NA
            lines.append("")
            continue
        lines.append(payload[pos:pos + length].decode("utf-8", "replace"))
        pos += length
    return lines


def austen(book: str) -> str:
    """The full text of one novel, lines joined with newlines."""
    if book not in BOOKS:
        raise TQError(f"unknown book {book!r}; choose one of {', '.join(BOOKS)}")
    data = _data_dir()
    offset, size = _index(data)[book]
    with open(data / "Rdata.rdb", "rb") as fh:
        fh.seek(offset)
        return "\n".join(_strings(fh.read(size)))


def read_corpus(path_or_book: str) -> tuple[str, str]:
    """(text, description) from a text file or 'austen:BOOK'."""
    if path_or_book.startswith("austen:"):
        book = path_or_book.split(":", 1)[1]
        return austen(book), f"Jane Austen, {book} (Debian r-cran-janeaustenr)"
    path = Path(path_or_book)
    if not path.is_file():
        raise TQError(f"corpus file {path} does not exist (or use austen:BOOK, BOOK one of "
                      f"{', '.join(BOOKS)})")
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except UnicodeDecodeError:
        raise TQError(f"corpus file {path} is not UTF-8 text") from None


if __name__ == "__main__":
    sys.stdout.write(austen(sys.argv[1] if len(sys.argv) > 1 else CALIBRATION_BOOK))
