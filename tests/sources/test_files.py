"""FileListSource: one record per file, its bytes and label; a missing file is named."""

from __future__ import annotations

import os

import numpy as np
import pytest

import jaxloader as jl


def files(tmp_path, n=9):
    paths = []
    for i in range(n):
        path = tmp_path / f"img-{i}.bin"
        path.write_bytes(bytes([i]) * (i + 1))
        paths.append(str(path))
    return paths


def decode(record):  # what a user's Map does: bytes -> array
    data = np.frombuffer(record["data"], np.uint8)
    return {"first": data[0], "size": np.int64(len(data)), "label": record["label"]}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bytes_and_labels_decoded_in_a_map(tmp_path, num_workers):
    paths = files(tmp_path)
    src = jl.FileListSource(paths, labels=[i % 3 for i in range(9)])
    with jl.DataLoader(src, batch_size=3, shuffle=True, seed=0, transforms=[jl.Map(decode)],
                       num_workers=num_workers, process_index=0, process_count=1) as loader:
        batches = list(loader)
    first = np.concatenate([b["first"] for b in batches])
    assert sorted(first.tolist()) == list(range(9))
    for b in batches:
        assert np.array_equal(b["size"], b["first"].astype(np.int64) + 1)
        assert np.array_equal(b["label"], b["first"] % 3)


def test_a_missing_file_fails_at_its_record_naming_the_path(tmp_path):
    paths = files(tmp_path, 4)
    (tmp_path / "img-2.bin").unlink()
    loader = jl.DataLoader(jl.FileListSource(paths), batch_size=4, process_index=0,
                           process_count=1, transforms=[jl.Map(lambda r: r)])
    with pytest.raises(jl.RecordError, match=r"img-2.bin.*record 2"):
        next(iter(loader))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_a_fifo_or_a_device_in_the_list_fails_at_its_record_not_waits(tmp_path):
    # a FIFO's open waited for a writer; /dev/zero was read until memory ran out, and the
    # MemoryError named no file
    os.mkfifo(tmp_path / "img-1.bin")
    source = jl.FileListSource([*files(tmp_path, 1), str(tmp_path / "img-1.bin"), "/dev/zero"])
    assert source[0]["data"]
    for index, name in ((1, "img-1.bin"), (2, "/dev/zero")):
        with pytest.raises(OSError, match=rf"{name}' \(record {index}\): .*not a regular file"):
            source[index]
    (tmp_path / "sub.bin").mkdir()  # (a folder: its descriptor was left open, each read)
    folder = jl.FileListSource([str(tmp_path / "sub.bin")])
    opened = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    for _ in range(20):
        with pytest.raises(OSError, match=r"record 0\): .*Is a directory: '.*sub.bin'"):
            folder[0]
    assert opened is None or len(os.listdir("/proc/self/fd")) == opened


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
@pytest.mark.timeout(60)
def test_a_parquet_file_or_a_shard_replaced_by_a_fifo_is_refused_not_waited_on(tmp_path):
    # made over a file, then the path a FIFO: the read's open() waited for a writer, for good
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": np.arange(8)}), tmp_path / "a.parquet")
    (tmp_path / "a.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(8)))
    made = [jl.DataLoader(jl.ParquetSource(tmp_path / "a.parquet"), batch_size=4),
            jl.StreamLoader(jl.Stream.jsonl(str(tmp_path / "a.jsonl")), batch_size=4)]
    for name in ("a.parquet", "a.jsonl"):
        (tmp_path / name).unlink()
        os.mkfifo(tmp_path / name)
    for loader, name in zip(made, ("a.parquet", "a.jsonl")):
        with loader, pytest.raises(jl.JaxloaderError, match=rf"not a regular file \(a FIFO.*"
                                                            rf"put the data in a file.*{name}"):
            next(iter(loader))


def test_bytes_paths_as_os_listdir_gives_them_are_read_and_saved(tmp_path):
    # a name that is not UTF-8 comes from os.listdir(b'...') as bytes: taken, then a bare
    # TypeError at the first read and at state_dict()
    folder = os.fsencode(tmp_path)
    with open(folder + b"/caf\xe9.bin", "wb") as f:
        f.write(b"y")
    (tmp_path / "ok.bin").write_bytes(b"x")
    paths = sorted(folder + b"/" + name for name in os.listdir(folder))
    with jl.DataLoader(jl.FileListSource(paths), batch_size=2, process_index=0,
                       process_count=1) as loader:
        assert sorted(next(iter(loader))["data"].tolist()) == [b"x", b"y"]
        assert loader.state_dict()["step"] == 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_about_a_record_names_its_file(tmp_path, num_workers):
    # a file read was named by its source index alone (paths[14]: the user's to look up),
    # and a MemoryError said nothing ("raised MemoryError: ;")
    paths = files(tmp_path, 6)
    gray = lambda r: {"image": np.zeros((4, 4) if r["data"][:1] == b"\x03" else (4, 4, 3),
                                        np.uint8)}  # noqa: E731 - (an L image among RGB)

    def failing(r):
        if r["data"][:1] == b"\x02":
            raise ValueError("cannot identify image file")
        return r

    def huge(r):
        raise MemoryError()

    for fn, expected in ((failing, r"record position 2 \(source index 2\) \(.*img-2.bin\): "
                                   r"transforms\[0\] Map\(.*failing\) raised ValueError"),
                         (gray, r"batch leaf \['image'\]: records differ: record position 0 "
                                r"\(.*img-0.bin\) has shape \(4, 4, 3\).*record position 3 "
                                r"\(.*img-3.bin\) has shape \(4, 4\).*other modes.*"
                                r"convert\('RGB'\)"),
                         (huge, r"img-0.bin\): transforms\[0\] Map\(.*huge\) raised MemoryError "
                                r"\(out of memory in this transform")):
        for source in (jl.FileListSource(paths),
                       jl.ConcatSource([jl.FileListSource(paths[:1]),
                                        jl.MapSource(jl.FileListSource(paths[1:]),
                                                     lambda r: r)])):
            with jl.DataLoader(source, batch_size=6, transforms=[jl.Map(fn)],
                               num_workers=num_workers, process_index=0,
                               process_count=1) as loader:
                with pytest.raises((jl.RecordError, jl.CollateError, jl.WorkerError),
                                   match=expected):
                    next(iter(loader))


def test_bad_arguments(tmp_path):
    with pytest.raises(jl.ConfigError, match="one path"):
        jl.FileListSource(str(tmp_path))
    with pytest.raises(jl.ConfigError, match=r"one label per path \(2\), got 1"):
        jl.FileListSource(["a", "b"], labels=[0])
    # class names, or floats that int64 would truncate (0.5 -> 0): refused, naming ints
    for labels, got in ((["cat", "dog"], "<U3"), ([0.5, 1.0], "float64")):
        with pytest.raises(jl.ConfigError, match=f"expected integers, got {got}"):
            jl.FileListSource(["a", "b"], labels=labels)
    with pytest.raises(jl.ConfigError, match=r"a regression's targets\), leave labels out and "
                                             r"look each up by its path in a Map"):
        jl.FileListSource(["a", "b"], labels=[0.5, 1.5])  # (told only to name classes by ints)
    assert jl.FileListSource(["a", "b"], labels=[True, False]).labels.tolist() == [1, 0]
    # a None named the first label ("first 0"), which was fine; a uint64 past int64 wrapped
    with pytest.raises(jl.ConfigError, match=r"got object \(labels\[1\] is None\)"):
        jl.FileListSource(["a", "b"], labels=[0, None])
    with pytest.raises(jl.ConfigError, match=r"9223372036854775813 is beyond int64"):
        jl.FileListSource(["a"], labels=np.array([2**63 + 5], np.uint64))
    # ints past int64 among others made them floats or objects: "expected integers", the
    # class names' remedy, and labels[0] named whatever it held
    for labels, at, value in (([-1, 2**63], 1, 2**63), ([2**64, 1], 0, 2**64)):
        with pytest.raises(jl.ConfigError, match=rf"labels\[{at}\] is {value}, beyond int64"):
            jl.FileListSource(["a", "b"], labels=labels)
    objects = jl.FileListSource(["a", "b"], labels=np.array([1, 2], dtype=object))
    assert objects.labels.dtype == np.int64 and objects.labels.tolist() == [1, 2]
    a = jl.FileListSource(["a", "b"]).fingerprint
    assert a != jl.FileListSource(["b", "a"]).fingerprint and a.startswith("files:2:")


def test_gs_paths_are_read_through_epath_in_workers(gcs):
    root, init = gcs
    (root / "bucket").mkdir()
    paths = [p.replace(str(root) + "/", "gs://") for p in files(root / "bucket")]
    src = jl.FileListSource(paths, labels=[i % 3 for i in range(9)])
    assert src[4]["data"] == bytes([4]) * 5
    with jl.DataLoader(src, batch_size=3, shuffle=True, seed=0, transforms=[jl.Map(decode)],
                       num_workers=2, worker_init_fn=init, process_index=0,
                       process_count=1) as loader:
        firsts = np.concatenate([b["first"] for b in loader])
    assert sorted(firsts.tolist()) == list(range(9))


def test_a_connection_error_is_told_as_the_storages(gcs, monkeypatch):
    import fake_gcs

    root, _ = gcs
    (root / "bucket").mkdir()
    paths = [p.replace(str(root) + "/", "gs://") for p in files(root / "bucket")]

    monkeypatch.setattr(fake_gcs.FakeGcs, "_open", fake_gcs.connection_reset)
    with pytest.raises(ConnectionResetError, match=r"FileListSource: 'gs://bucket/\S+': reading "
                       r"record 4 failed .*the storage or the network failed, not the file"):
        jl.FileListSource(paths)[4]


@pytest.mark.skipif(not hasattr(os, "O_NONBLOCK"), reason="POSIX opens")
def test_a_file_whose_open_without_waiting_would_block_is_opened_waiting(tmp_path, monkeypatch):
    # a lease another process holds: an open without waiting fails (EWOULDBLOCK), where the
    # plain open waits for it; a FIFO is still refused, not waited on
    from jaxloader.base import file_identity

    real = os.open
    monkeypatch.setattr(os, "open", lambda name, flags, *a: (_ for _ in ()).throw(
        BlockingIOError(11, "leased")) if flags & os.O_NONBLOCK else real(name, flags, *a))
    (tmp_path / "a.bin").write_bytes(b"data")
    with file_identity.open_binary(str(tmp_path / "a.bin")) as raw:
        assert raw.read() == b"data"
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(OSError, match=r"not a regular file \(a FIFO"):
        file_identity.open_binary(str(tmp_path / "pipe"))
