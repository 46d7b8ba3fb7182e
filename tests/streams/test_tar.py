"""TarShard: headers as tarfile writes them (ustar, GNU, pax); other files refused by name."""

from __future__ import annotations

import io
import tarfile

import pytest

import jaxloader as jl
from streams.test_shards import read_all


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tar_headers_are_read_as_tarfile_reads_them(tmp_path, fmt):
    """Long names (GNU and pax headers, ustar prefixes), directories and empty files."""
    path = tmp_path / "formats.tar"
    deep = "d" * 60 + "/" + "e" * 60 if fmt == tarfile.USTAR_FORMAT else "x" * 150
    with tarfile.open(path, "w", format=fmt) as tar:
        tar.addfile(_dir(deep))
        for i in range(3):
            for ext, data in (("txt", b"t" * (i * 300)), ("json", b'{"i": %d}' % i)):
                info = tarfile.TarInfo(f"{deep}/key{i}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    got = read_all(jl.TarShard(path))
    assert [r["__key__"] for r in got] == [f"{deep}/key{i}" for i in range(3)]
    assert [len(r["txt"]) for r in got] == [0, 300, 600] and got[2]["json"] == b'{"i": 2}'
    shard = jl.TarShard(path)
    shard.reset()
    shard.next()
    assert read_all(jl.TarShard(path), shard.get_state()) == got[1:]


def _dir(name):
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


def test_foreign_files_are_refused_by_name(tmp_path):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"hello world, not a tar" * 40)
    shard = jl.TarShard(junk)
    with pytest.raises(jl.RecordError, match=r"junk.tar: byte 0: not a tar header"):
        shard.reset()
