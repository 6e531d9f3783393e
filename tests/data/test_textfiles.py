"""A local text file whose document (a line, a paragraph, the whole file) is huge fails fast in one line, found
by reading the file in pieces (memory bounded by the piece size, whatever the file), before anything is
tokenized."""

import random
import re
import tracemalloc

import pytest

from loopnet.data import DataConfigError, TokenStreamDataModule, textfiles


def reference(data: bytes, sample_by: str, limit: int):
    """Start of the first document longer than `limit` bytes, from splitting the whole content at once."""
    if sample_by == "document":
        return 0 if len(data) > limit else None
    sep = re.compile(rb"\n" if sample_by == "line" else rb"\n\r?\n")
    start = 0
    for m in [*sep.finditer(data), None]:
        end = len(data) if m is None else m.start()
        if end - start > limit:
            return start
        if m is not None:
            start = m.end()
    return None


@pytest.mark.parametrize("sample_by", ["line", "paragraph", "document"])
@pytest.mark.parametrize("seed", range(40))
def test_the_first_document_over_the_limit_is_found_across_piece_boundaries(tmp_path, monkeypatch, sample_by, seed):
    rng = random.Random(seed)
    monkeypatch.setattr(textfiles, "CHUNK_BYTES", rng.choice([1, 2, 3, 5, 8]))
    limit = rng.choice([8, 13, 40])
    alphabet = [b"a", b"b", b"\n", b"\r\n", b"\n\n", b"\r\n\r\n", b" "]
    weights = [30, 30, rng.choice([0, 1, 4]), 1, rng.choice([0, 1, 3]), 1, 5]
    data = b"".join(rng.choices(alphabet, weights, k=rng.randint(0, 300)))
    path = tmp_path / "a.txt"
    path.write_bytes(data)
    assert textfiles.largest_document_start(str(path), sample_by, limit) == reference(data, sample_by, limit)


def test_a_huge_single_line_is_found_in_memory_bounded_by_the_piece_size(tmp_path):
    path = tmp_path / "one_line.txt"
    with open(path, "wb") as f:  # a sparse file: one line of NUL bytes, just over the limit, costs no disk
        f.truncate(textfiles.MAX_DOCUMENT_BYTES + 1)
    tracemalloc.start()
    try:
        with pytest.raises(DataConfigError) as info:
            textfiles.check_documents([str(path)], "paragraph")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a piece, the previous piece's tail prepended to it, and the piece before it being freed
    assert peak <= 3 * textfiles.CHUNK_BYTES + (1 << 20), peak
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path} holds a paragraph of more than 64 MiB (from byte 0)")
    assert "fix: cut it into shorter lines" in msg and "data.sample_by: line" in msg


@pytest.mark.parametrize("sample_by", ["line", "paragraph", "document"])
def test_the_data_module_refuses_before_tokenizing(tmp_path, monkeypatch, sample_by):
    monkeypatch.setattr(textfiles, "MAX_DOCUMENT_BYTES", 1 << 20)
    monkeypatch.setattr(textfiles, "CHUNK_BYTES", 1 << 16)
    (tmp_path / "a.txt").write_text("a short first file\n\nof two paragraphs\n")
    (tmp_path / "b.txt").write_text("word " * (1 << 19))  # 2.5 MiB on one line
    encoded = []
    monkeypatch.setattr("loopnet.data.stream.encode", lambda *a, **k: encoded.append(1))
    dm = TokenStreamDataModule(
        seq_len=8, batch_size=2, source="files", path=str(tmp_path / "*.txt"), sample_by=sample_by
    )
    with pytest.raises(
        DataConfigError,
        match=rf"^{tmp_path}/b.txt (holds a {sample_by} of more than 1 MiB|is 2 MiB, "
        rf"read and tokenized as one document)",
    ):
        dm.setup("fit")
    assert encoded == []


def test_documents_under_the_limit_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(textfiles, "MAX_DOCUMENT_BYTES", 1 << 12)
    (tmp_path / "a.txt").write_text(("a line of text\n" * 200 + "\n") * 5)  # paragraphs of 3,000 bytes
    for sample_by in ("line", "paragraph"):
        textfiles.check_documents([str(tmp_path / "a.txt")], sample_by)
    with pytest.raises(DataConfigError):
        textfiles.check_documents([str(tmp_path / "a.txt")], "document")  # the file: 15,005 bytes


@pytest.mark.parametrize("seed", range(30))
def test_the_first_byte_that_is_not_utf8_is_found_across_pieces(tmp_path, monkeypatch, seed):
    """Its offset equals the whole content's decode error, whatever the piece size cuts (characters of 2-4
    bytes split between pieces included)."""
    rng = random.Random(seed)
    text = "".join(rng.choice(["a", "é", "€", "𝄞", "\n"]) for _ in range(rng.randint(0, 60))).encode("utf-8")
    bad = rng.choice([b"", b"\xff", b"\xc3", b"\xe2\x82", b"\xf0\x9d\x84", b"\x80", b"\xed\xa0\x80"])
    data = text[: rng.randint(0, len(text))] + bad + text
    path = tmp_path / "c.txt"
    path.write_bytes(data)
    monkeypatch.setattr(textfiles, "CHUNK_BYTES", rng.randint(1, 7))
    try:
        data.decode("utf-8")
        expected = None
    except UnicodeDecodeError as e:
        expected = f"byte 0x{data[e.start]:02x} at offset {e.start:,}"
    assert textfiles.utf8_error(str(path)) == expected


def test_the_file_that_is_not_utf8_is_named_among_several(tmp_path):
    (tmp_path / "a.txt").write_text("fine text\n" * 50)
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "Ca va tr\xe8s bien"}\n')
    (tmp_path / "c.txt").write_text("more fine text\n")
    files = [str(tmp_path / f) for f in ("a.txt", "b.jsonl", "c.txt")]
    with pytest.raises(DataConfigError) as info:
        textfiles.check_documents(files, "line")
    assert str(info.value) == (
        f"{tmp_path}/b.jsonl is not valid UTF-8 (byte 0xe8 at offset 35). Fix: re-encode it "
        "as UTF-8, e.g. with `iconv -f <its encoding, e.g. latin1> -t UTF-8`"
    )
