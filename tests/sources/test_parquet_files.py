"""ParquetSource's files: opened when read (thousands of files under a descriptor limit),
damaged pages and changed files named, permissions named (``sources.parquet_files``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import jaxloader as jl
from sources.test_parquet import write_parts

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytestmark = pytest.mark.timeout(180)
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """1,500 small Parquet files: more than the 1,024 descriptors a process may hold."""
    folder = tmp_path_factory.mktemp("many")
    for k in range(1500):
        pq.write_table(pa.table({"id": np.arange(k * 4, k * 4 + 4, dtype=np.int64)}),
                       folder / f"part-{k:04d}.parquet")
    return folder


@pytest.mark.parametrize("workers", [0, 2])
def test_every_row_of_1500_files_is_read_under_a_1024_descriptor_limit(many_files, workers):
    run = subprocess.run([sys.executable, os.path.join(HERE, "parquet_fd_run.py"),
                          str(many_files), str(workers)], capture_output=True, text=True,
                         timeout=150, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["rows"] == found["distinct"] == 6000
    assert found["after"] == found["before"]  # close() left no descriptor open


def _loader(paths, workers, **kwargs):
    return jl.DataLoader(jl.ParquetSource(paths), batch_size=8, num_workers=workers,
                         process_index=0, process_count=1, **kwargs)


def _write(path, values, **kwargs):
    table = pa.table({"x": np.asarray(values, np.int64), "y": np.arange(len(values))})
    pq.write_table(table, path, use_dictionary=False, compression="NONE", **kwargs)
    return str(path)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_page_that_fails_its_checksum_is_an_error_naming_file_row_group_and_column(
        tmp_path, workers):
    path = _write(tmp_path / "crc.parquet", np.arange(1000) * 7919, write_page_checksum=True)
    damaged = bytearray(open(path, "rb").read())
    damaged[damaged.index(np.int64(500 * 7919).tobytes())] ^= 1  # one bit of row 500's x
    open(path, "wb").write(damaged)
    with _loader([path], workers) as loader, pytest.raises(
            jl.JaxloaderError, match=r"crc.parquet', row group 0 \(rows 0..999 of the file\), "
                                     r"column 'x': cannot be decoded \(OSError: .*CRC checksum "
                                     r"verification failed"):
        for _ in loader:
            pass


@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_page_header_is_an_error_naming_file_row_group_and_column(tmp_path, workers):
    path = _write(tmp_path / "thrift.parquet", np.arange(100))
    offset = pq.ParquetFile(path).metadata.row_group(0).column(1).data_page_offset
    damaged = bytearray(open(path, "rb").read())
    damaged[offset:offset + 8] = b"\xff" * 8
    open(path, "wb").write(damaged)
    with _loader([path], workers) as loader, pytest.raises(
            jl.JaxloaderError, match=r"thrift.parquet', row group 0 \(rows 0..99 of the file\), "
                                     r"column 'y': cannot be decoded \(OSError: Couldn't "
                                     r"deserialize thrift"):
        next(iter(loader))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_over_other_bytes_is_refused_naming_the_file(tmp_path, workers):
    paths = write_parts(tmp_path)
    with _loader(paths, workers, shuffle=True) as loader:
        it = iter(loader)
        next(it), next(it)
        state = json.loads(json.dumps(loader.state_dict()))
    original = open(paths[1], "rb").read()
    table = pq.read_table(paths[1])  # the same schema and row count, other values
    pq.write_table(table.set_column(0, "id", pa.compute.add(table["id"], 1000)), paths[1],
                   row_group_size=16)
    with _loader(paths, workers, shuffle=True) as again, pytest.raises(
            jl.StateDictError, match=r"state\['files'\]: 1 of the source's 3 files changed "
                                     r"since the state was saved, or are other files "
                                     r"\(.*part-1.parquet: "):
        again.load_state_dict(state)
    pq.write_table(table, paths[1], row_group_size=8)  # the same rows, other row groups: the
    with _loader(paths, workers, shuffle=True) as again, pytest.raises(  # file is still named
            jl.StateDictError, match=r"state\['files'\]: 1 of the source's 3 files changed "
                                     r"since the state was saved, or are other files "
                                     r"\(.*part-1.parquet: "):
        again.load_state_dict(state)  # (it was "source: expected 'parquet:...', received")
    shutil.copy(paths[0], tmp_path / "copy")  # a copy of the same bytes (another time) is
    os.replace(tmp_path / "copy", paths[0])  # the same file: the state still restores
    open(paths[1], "wb").write(original)  # put back
    with _loader(paths, workers, shuffle=True) as again:
        again.load_state_dict(state)
        assert again.step == 2


def test_a_state_over_a_folder_that_gained_or_lost_a_file_names_them(tmp_path):
    # refused by the record count and the source's hash alone ("num_records: expected 40,
    # received 30; source: ..."): which file was new was not said
    paths = [_write(tmp_path / f"p{i}.parquet", np.arange(10) + 10 * i) for i in range(3)]
    with _loader(paths, 0) as loader:
        next(iter(loader))
        state = json.loads(json.dumps(loader.state_dict()))
    added = paths + [_write(tmp_path / "p3.parquet", np.arange(10) + 100)]
    with _loader(added, 0) as again, pytest.raises(
            jl.StateDictError, match=r"state\['files'\]: the state was saved over 3 file\(s\), "
                                     r"the source reads 4; not among the saved: \S*p3.parquet "
                                     r"\(added or changed since\): .*pass the saved files"):
        again.load_state_dict(state)
    with _loader(paths[::2], 0) as fewer, pytest.raises(
            jl.StateDictError, match=r"saved over 3 file\(s\), the source reads 2; 1 saved "
                                     r"file\(s\) are not read now \(removed or changed\)"):
        fewer.load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_file_replaced_under_a_live_loader_is_noticed_at_its_next_row_group(tmp_path,
                                                                              workers):
    paths = write_parts(tmp_path)
    with _loader(paths, workers) as loader:  # file order: part-2 is read last
        shutil.copy(paths[2], tmp_path / "copy")  # the same bytes put in place: read on
        os.replace(tmp_path / "copy", paths[2])
        assert sum(len(b["id"]) for b in loader) == 128
    with _loader(paths, workers) as loader:
        table = pq.read_table(paths[2])
        pq.write_table(table.set_column(0, "id", pa.compute.add(table["id"], 1000)),
                       tmp_path / "new", row_group_size=16)
        os.replace(tmp_path / "new", paths[2])
        with pytest.raises(jl.JaxloaderError, match=r"part-2.parquet' changed while the loader "
                                                    r"reads it \(size [\d,]+ bytes then"):
            for _ in loader:
                pass


def test_a_file_replaced_while_open_in_the_process_is_noticed_at_its_next_row_group(tmp_path):
    paths = write_parts(tmp_path)
    with _loader(paths, 0) as loader:  # file order: part-2 holds rows 87..127
        it = iter(loader)
        ids = [next(it)["id"] for _ in range(12)]  # part-2 is open: its first row group read
        assert ids[-1][-1] == 95
        table = pq.read_table(paths[2])
        pq.write_table(table.set_column(0, "id", pa.compute.add(table["id"], 1000)),
                       tmp_path / "new", row_group_size=16)
        os.replace(tmp_path / "new", paths[2])
        with pytest.raises(jl.RecordError, match=r"part-2.parquet' changed while the loader "
                                                 r"reads it"):
            for _ in it:
                pass


@pytest.mark.parametrize("written", ["rewritten", "half written", "then moved away"])
def test_a_file_rewritten_in_place_as_a_row_group_is_read_is_named_as_changed(tmp_path,
                                                                          monkeypatch, written):
    """The rewrite lands between the check before a read and the read (the race two workers
    met, where the error said the file was damaged and sent the user to replace it)."""
    from jaxloader.sources.parquet_files import ParquetFiles

    paths = write_parts(tmp_path)
    files = ParquetFiles(paths)
    files.read(2, 0, ["id"])  # open, its footer read
    monkeypatch.setattr(ParquetFiles, "_check", lambda self, number: None)  # (passed before)
    table = pq.read_table(paths[2])
    pq.write_table(table.set_column(0, "id", pa.compute.add(table["id"], 1000)),
                   tmp_path / "new", row_group_size=7)
    new = open(tmp_path / "new", "rb").read()
    with open(paths[2], "r+b") as f:  # in place: the same inode, the open handle reads it
        f.write(new if written == "rewritten" else new[:len(new) // 2])
        f.truncate()
    said = r"size [\d,]+ bytes then"
    if written == "then moved away":
        os.replace(paths[2], tmp_path / "elsewhere")
        said = r"it cannot be found or read whole now"
    with pytest.raises(jl.RecordError, match=rf"part-2.parquet' changed while the loader reads "
                                             rf"it \({said}"):
        files.read(2, 1, ["id"])
    files.close()


@contextlib.contextmanager
def _as_nobody():
    """This process's effective user is one without rights to root's files (as root)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_a_file_without_read_permission_is_an_oserror_naming_it_and_the_permission():
    folder = tempfile.mkdtemp(dir="/tmp")
    try:
        os.chmod(folder, 0o755)
        path = _write(os.path.join(folder, "secret.parquet"), np.arange(10))
        os.chmod(path, 0o000 if os.geteuid() else 0o600)
        with _as_nobody(), pytest.raises(PermissionError, match=r"no permission to read this "
                                                                r"file, mode 600.*chmod a\+r"
                                                                r".*secret.parquet") as caught:
            jl.ParquetSource(path)
        assert not isinstance(caught.value, jl.ConfigError)  # not "not a Parquet file"
    finally:
        shutil.rmtree(folder)


def test_rows_moved_within_their_row_groups_are_a_changed_file(tmp_path):
    # (values that do not compress, written by pyarrow's default writer, keep the file's size
    # and footer, statistics and all, when its rows move within their row groups: a restore
    # over the reshuffled file was quiet, and read 243 of 1,000 rows twice in the epoch, the
    # audit's run; a running loader took it for a copy put in place)
    from jaxloader.base import file_identity

    rng = np.random.default_rng(0)
    uid, emb = rng.integers(0, 2**62, 1000), rng.normal(size=1000).astype(np.float32)
    path = str(tmp_path / "features.parquet")

    def write(order):
        pq.write_table(pa.table({"uid": uid[order], "emb": emb[order]}), path,
                       row_group_size=250)

    def make():
        return jl.DataLoader(jl.ParquetSource(path), batch_size=100, shuffle=True, seed=0)

    write(np.arange(1000))
    saved = file_identity.parquet(path)
    with make() as loader:
        batches = iter(loader)
        next(batches)
        state, want = loader.state_dict(), next(batches)["uid"]
    moved = np.concatenate([s + rng.permutation(250) for s in range(0, 1000, 250)])
    write(moved)
    assert file_identity.parquet(path)[:2] == saved[:2]  # (the footer alike: the case)
    with make() as again, pytest.raises(jl.StateDictError, match=r"features.parquet: the same "
                                        r"size, its footer, or the rows before it"):
        again.load_state_dict(state)
    write(np.arange(1000))  # (put back: the state restores, and one written before this
    for files in (state["files"], [saved[:2]]):  # version, its footer's CRC alone, too)
        with make() as again:
            again.load_state_dict({**state, "files": files})
            np.testing.assert_array_equal(next(iter(again))["uid"], want)
    with jl.DataLoader(jl.ParquetSource(path), batch_size=250) as loader:
        batches = iter(loader)
        next(batches)
        write(moved)  # (under the running loader: not a copy put in place)
        os.utime(path, ns=(1, 1))
        with pytest.raises(jl.RecordError, match="features.parquet' changed while"):
            next(batches)


def test_a_kept_files_stamp_of_a_parquet_file_is_its_size_and_footer_as_before(tmp_path):
    # (a file kept from a FilteredSource or PackedSource over Parquet files names each by its
    # identity and time; the identity's third hash, since 2026-12-02, left out of it, lest
    # every file kept before be found stale and the pass run again)
    from jaxloader.base import file_identity
    from jaxloader.sources.fingerprint import file_stamps

    paths = write_parts(tmp_path)
    stamps = [f"{file_identity.parquet(p)[:2]}@{os.stat(p).st_mtime_ns}" for p in paths]
    assert file_stamps(jl.ParquetSource(paths)) == [repr(stamps)]
    assert len(jl.ParquetSource(paths).file_identities()[0][1]) == 3


def test_a_footer_that_nearly_fills_the_first_read_still_hashes_a_kib_of_data(tmp_path):
    # (a footer of 64,504-65,528 bytes fit the 64 KiB read with less than a KiB of data before
    # it, none at 65,528: rows moved within their row groups went unseen again; the review)
    import zlib

    from jaxloader.base import file_identity

    path = str(tmp_path / "wide.parquet")

    def footer_of(pad):
        table = pa.table({"x": np.arange(1000)}).replace_schema_metadata({"pad": "a" * pad})
        pq.write_table(table, path)
        with open(path, "rb") as raw:
            raw.seek(-8, 2)
            return int.from_bytes(raw.read(4), "little")

    low, high = 0, 64 << 10  # (the metadata's length whose footer is 65,528 - 300 bytes)
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if footer_of(mid) < 65528 - 300 else (low, mid)
    length = footer_of(low)
    assert 65528 - 1024 < length <= 65528
    with open(path, "rb") as raw:
        raw.seek(-8 - length - 1024, 2)
        before = raw.read(1024)
    assert file_identity.parquet(path)[2] == zlib.crc32(before)
    # (and a state saved before this version over two files of one size and footer: each
    # matched in its place, not both as the last)
    now = [[10, 1, 7], [10, 1, 8]]
    assert file_identity.as_now([[10, 1], [10, 1]], now) == now
