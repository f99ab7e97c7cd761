"""Property tests of the native bounded collector over arbitrary chunkings and caps."""

from __future__ import annotations

import itertools
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from shellseam import _core

chunks_st = st.lists(st.binary(min_size=0, max_size=300), max_size=40)


def _utf8_tail(data: bytes) -> str:
    # Strip at most three leading continuation bytes, then decode with replacement.
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
        skip += 1
    return data[skip:].decode("utf-8", "replace")


@settings(max_examples=300, deadline=None)
@given(chunks=chunks_st, cap=st.integers(1, 500), spill_cap=st.integers(0, 3000))
def test_tail_truncation_and_spill(chunks: list[bytes], cap: int, spill_cap: int) -> None:
    with tempfile.TemporaryDirectory() as parent:
        c = _core.Collector(cap, spill_cap, parent)
        for chunk in chunks:
            c.push(chunk)
        stream = b"".join(chunks)
        got = c.collected()
        text, truncated, spill_path = got.text, got.truncated, got.spill_path
        total, spill_truncated = got.total_bytes, got.spill_truncated
        assert total == len(stream)
        assert c.tail_bytes() == stream[-cap:]
        assert truncated == (len(stream) > cap)
        if truncated:
            assert text == _utf8_tail(stream[-cap:])
            assert spill_path is not None
            with open(spill_path, "rb") as f:
                assert f.read() == stream[:spill_cap]
            assert spill_truncated == (len(stream) > spill_cap)
        else:
            assert text == stream.decode("utf-8", "replace")
            assert spill_path is None and not spill_truncated


def _incomplete_suffix(data: bytes) -> int:
    """Length of a trailing, incomplete UTF-8 sequence (what a non-final read holds back)."""
    for back in range(1, min(3, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:
            continue
        need = 2 if 0xC2 <= b <= 0xDF else 3 if 0xE0 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 1
        return back if need > back else 0
    return 0


@st.composite
def split_text(draw: st.DrawFn) -> list[bytes]:
    """Valid UTF-8 text cut at arbitrary byte offsets (code points may be split)."""
    data = draw(st.text(max_size=400)).encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=20)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=300, deadline=None)
@given(chunks=split_text(), cap=st.integers(4, 400), reads=st.lists(st.booleans(), max_size=25))
def test_consuming_reads_deliver_each_kept_byte_once(
    chunks: list[bytes], cap: int, reads: list[bool]
) -> None:
    with tempfile.TemporaryDirectory() as parent:
        c = _core.Collector(cap, 1 << 20, parent)
        delivered = []
        lossy_seen = False
        read_pos = 0
        total = 0
        expect_lossy = False
        for i, chunk in enumerate(chunks):
            c.push(chunk)
            total += len(chunk)
            if total - cap > read_pos:
                expect_lossy = True
            if i < len(reads) and reads[i]:
                got = c.read(False)
                text, lossy = got.text, got.lossy
                delivered.append(text)
                lossy_seen |= lossy
                # A read consumes everything but a held-back incomplete character.
                read_pos = total - _incomplete_suffix(b"".join(chunks[: i + 1]))
        got = c.read(True)
        text, lossy = got.text, got.lossy
        delivered.append(text)
        lossy_seen |= lossy
        stream = b"".join(chunks)
        assert lossy_seen == expect_lossy
        if not lossy_seen:
            # Nothing dropped: every byte arrives exactly once and no read split a character.
            assert "".join(delivered) == stream.decode()
            assert all("\ufffd" not in d for d in delivered)
        else:
            assert "".join(delivered).endswith(_utf8_tail(stream[-cap:])[-1:] if stream else "")
        assert c.read(True).text == ""


def test_a_padded_block_cut_short_by_a_file_size_limit_leaves_no_zeros(tmp_path: object) -> None:
    # Past its first MiBs a spill file is written uncached, its last block padded with zeros
    # and the file cut back. A file size limit can cut that write short after part of the
    # padding went out: the file must still end where the stream did. Its own interpreter:
    # RLIMIT_FSIZE is per process (Python ignores SIGXFSZ, so the write fails with EFBIG).
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import os, resource, sys, tempfile
        from shellseam import _core
        data = bytes(range(1, 256)) * ((5 << 20) // 255 + 40)
        data = data[: (5 << 20) + 5000]
        with tempfile.TemporaryDirectory(dir="/dev/shm") as parent:
            c = _core.Collector(1000, 64 << 20, parent)
            c.push(data[:-5000])
            resource.setrlimit(resource.RLIMIT_FSIZE, (len(data) + 100, resource.RLIM_INFINITY))
            c.push(data[-5000:])
            got = c.collected()
            with open(got.spill_path, "rb") as f:
                spilled = f.read()
            assert data.startswith(spilled), (len(spilled), spilled[-8:])
            print(len(spilled), got.spill_truncated)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
