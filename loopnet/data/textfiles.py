"""How large a document of a local text file gets: `datasets`' text builder reads each document whole (a
line, a blank-line paragraph, or the whole file), and loopnet tokenizes it whole, so one 1 GB line takes
gigabytes of memory and minutes before the first step. `check_documents` finds a document over
`MAX_DOCUMENT_BYTES` by reading the files in `CHUNK_BYTES` pieces (memory bounded by a few pieces,
whatever the file), and fails in one line naming the file and the fix before anything is tokenized; so does a
file that is not UTF-8 (the error `datasets` would raise names no file, however many data.path lists)."""

from __future__ import annotations

import codecs
import os
import re

from loopnet.data.errors import DataConfigError

MAX_DOCUMENT_BYTES = 64 << 20  # ~16M GPT-2 tokens: far beyond any window, a few hundred MB to tokenize
CHUNK_BYTES = 8 << 20
_TEXT = (".txt", ".md", ".text")  # what the text builder reads; compressed files are left to it
_UTF8 = (*_TEXT, ".json", ".jsonl")  # files read as UTF-8 text
_SEPARATORS = {"line": re.compile(rb"\n"), "paragraph": re.compile(rb"\n\r?\n")}


def largest_document_start(path: str, sample_by: str, limit: int | None = None) -> int | None:
    """The byte offset where a document of `path` longer than `limit` bytes starts; None if there is none.
    "document": the file itself; "line"/"paragraph": the text between newlines / blank lines."""
    limit = MAX_DOCUMENT_BYTES if limit is None else limit
    if sample_by == "document":
        return 0 if os.path.getsize(path) > limit else None
    sep, chunk = _SEPARATORS[sample_by], min(CHUNK_BYTES, limit)
    start, pos, tail = 0, 0, b""  # where the current document starts; bytes read; the last 2 bytes read before
    with open(path, "rb") as f:
        while piece := f.read(chunk):
            window = tail + piece  # with the tail: a separator (up to 3 bytes) cut by the piece boundary
            found = list(sep.finditer(window))
            base = pos - len(tail)
            if found and base + found[0].start() - start > limit:
                return start
            if found:
                start = base + found[-1].end()
            pos += len(piece)
            if pos - start > limit:
                return start
            tail = window[-2:]
    return None


def utf8_error(path: str) -> str | None:
    """Where file `path` stops being UTF-8 ("byte 0xff at offset 1,004"), or None; read in CHUNK_BYTES pieces."""
    decoder, pos = codecs.getincrementaldecoder("utf-8")(), 0
    with open(path, "rb") as f:
        while True:
            piece = f.read(CHUNK_BYTES)
            held = len(decoder.getstate()[0])  # the start of a character cut by the last piece's end
            try:
                decoder.decode(piece, final=not piece)
            except UnicodeDecodeError as e:  # positions count the held bytes, then this piece
                return f"byte 0x{e.object[e.start]:02x} at offset {pos - held + e.start:,}"
            if not piece:
                return None
            pos += len(piece)


def check_documents(files: list[str], sample_by: str) -> None:
    """Raise `DataConfigError` when a text or json file of `files` is not UTF-8, or a .txt/.md file holds a
    document over MAX_DOCUMENT_BYTES."""
    for path in files:
        if path.lower().endswith(_UTF8) and (where := utf8_error(path)):
            raise DataConfigError(
                f"{path} is not valid UTF-8 ({where}). Fix: re-encode it as UTF-8, e.g. with "
                f"`iconv -f <its encoding, e.g. latin1> -t UTF-8`"
            )
        if not path.lower().endswith(_TEXT):
            continue
        at = largest_document_start(path, sample_by)
        if at is None:
            continue
        limit = f"{MAX_DOCUMENT_BYTES / 2**20:g} MiB"
        if sample_by == "document":
            raise DataConfigError(
                f"{path} is {os.path.getsize(path) / 2**20:.0f} MiB, read and tokenized as one "
                f"document (data.sample_by: document), over the {limit} a document may hold; fix: "
                f"data.sample_by: paragraph (or line)"
            )
        raise DataConfigError(
            f"{path} holds a {sample_by} of more than {limit} (from byte {at:,}), read and "
            f"tokenized whole (data.sample_by: {sample_by}); fix: cut it into shorter lines, e.g. "
            f"`fold -s -w 1000 {path} > cut.txt`, and read that with data.sample_by: line"
        )
