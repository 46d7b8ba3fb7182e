"""A file source's paths: folders and glob patterns expanded, sorted, and checked."""

from __future__ import annotations

import os

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sources.paths import expand

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def touch(root, *names):
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def test_folders_and_patterns_become_their_files_sorted_in_the_order_given(tmp_path):
    touch(tmp_path, "b.parquet", "a.parquet", "notes.txt", "sub/c.parquet", "other/z.parquet")
    names = lambda paths: [os.path.relpath(p, tmp_path) for p in paths]  # noqa: E731
    assert names(expand(str(tmp_path / "sub"), ".parquet", "S")) == ["sub/c.parquet"]
    assert names(expand(tmp_path, ".parquet", "S")) == [
        "a.parquet", "b.parquet", "other/z.parquet", "sub/c.parquet"]
    assert names(expand(str(tmp_path / "*.parquet"), ".parquet", "S")) == [
        "a.parquet", "b.parquet"]
    assert names(expand(str(tmp_path / "**" / "*.parquet"), ".x", "S")) == [
        "a.parquet", "b.parquet", "other/z.parquet", "sub/c.parquet"]
    # a list keeps its order; plain paths are kept as they are (checked by the source)
    assert names(expand([tmp_path / "sub", str(tmp_path / "[ab].parquet"), "missing.parquet"],
                        ".parquet", "S")) == [
        "sub/c.parquet", "a.parquet", "b.parquet", os.path.relpath("missing.parquet", tmp_path)]


def test_a_folder_named_like_a_file_stands_for_its_files_not_itself(tmp_path):
    # Spark and Dask write train.parquet/part-*.parquet: the folder matched *.parquet too
    touch(tmp_path, "a.parquet", "train.parquet/part-0.parquet", "train.parquet/part-1.parquet")
    os.symlink(tmp_path / "gone.parquet", tmp_path / "link.parquet")  # (named where opened)
    names = lambda paths: [os.path.relpath(p, tmp_path) for p in paths]  # noqa: E731
    files = ["a.parquet", "link.parquet", "train.parquet/part-0.parquet",
             "train.parquet/part-1.parquet"]
    assert names(expand(tmp_path, ".parquet", "S")) == files
    assert names(expand(str(tmp_path / "**" / "*.parquet"), ".parquet", "S")) == files
    assert names(expand(str(tmp_path / "*.parquet"), ".parquet", "S")) == files


def test_a_parquet_folder_is_listed_as_pandas_and_pyarrow_list_it(tmp_path):
    # A Spark job's leftover _temporary/ copy was read too (every row twice), and a Hive-
    # partitioned folder was read without its partition columns, both without a word.
    touch(tmp_path / "out", "part-0.parquet", "_temporary/0/task/part-0.parquet",
          ".hidden/part-0.parquet")
    names = lambda paths: [os.path.relpath(p, tmp_path) for p in paths]  # noqa: E731
    assert names(expand(tmp_path / "out", ".parquet", "S", dataset=True)) == [
        "out/part-0.parquet"]
    assert names(expand(str(tmp_path / "o*"), ".parquet", "S", dataset=True)) == [
        "out/part-0.parquet"]
    assert len(expand(tmp_path / "out", ".parquet", "S")) == 2  # other sources: as before
    touch(tmp_path / "hive", "split=a/label=0/p.parquet", "split=b/label=1/p.parquet")
    with pytest.raises(jl.ConfigError, match=r"ParquetSource\(paths\): '.*hive' is a Hive-"
                                             r"partitioned folder .*the columns split, label are "
                                             r"in its folders' names.*\*\*/\*.parquet"):
        jl.ParquetSource(tmp_path / "hive")
    assert len(expand(str(tmp_path / "hive" / "**" / "*.parquet"), ".parquet", "S",
                      dataset=True)) == 2  # the files themselves: read as they are


def test_a_file_named_like_a_pattern_is_that_file(tmp_path):
    touch(tmp_path, "part[1].parquet", "part1.parquet")
    assert expand(str(tmp_path / "part[1].parquet"), ".parquet", "S") == [
        str(tmp_path / "part[1].parquet")]


def test_a_folder_named_like_a_pattern_is_that_folder(tmp_path):
    # "run[1]" was a pattern first: it read the folder run1 beside it, silently
    touch(tmp_path, "run[1]/a.parquet", "run1/b.parquet", "what?/c.parquet", "whatX/d.parquet")
    assert expand(str(tmp_path / "run[1]"), ".parquet", "S") == [
        str(tmp_path / "run[1]" / "a.parquet")]
    assert expand(str(tmp_path / "what?"), ".parquet", "S") == [
        str(tmp_path / "what?" / "c.parquet")]
    assert expand(str(tmp_path / "run[0-9]"), ".parquet", "S") == [  # (a pattern still)
        str(tmp_path / "run1" / "b.parquet")]


def test_files_named_outside_utf8_have_a_state(tmp_path):
    # a name in Latin-1 is a str with surrogates (os.fsdecode): state_dict() raised
    # UnicodeEncodeError as it digested the names
    for i, name in enumerate([b"caf\xe9 0.bin", b"caf\xe9 1.bin"]):
        with open(os.path.join(os.fsencode(tmp_path), name), "wb") as f:
            f.write(bytes([i]) * 4)
    paths = sorted(os.path.join(str(tmp_path), n) for n in os.listdir(str(tmp_path)))
    with jl.DataLoader(jl.FileListSource(paths, labels=[0, 1]), batch_size=1,
                       process_index=0, process_count=1) as loader:
        assert [b["data"][0] for b in loader] == [b"\0" * 4, b"\1" * 4]
        state = loader.state_dict()
    with jl.DataLoader(jl.FileListSource(paths, labels=[0, 1]), batch_size=1,
                       process_index=0, process_count=1) as again:
        again.load_state_dict(state)


def test_a_pattern_or_folder_with_no_file_is_named(tmp_path):
    touch(tmp_path / "empty", "notes.txt")
    with pytest.raises(jl.ConfigError, match=r"ParquetSource\(paths\): '.*nope-\*.parquet' "
                                             r"matches no file"):
        expand(str(tmp_path / "nope-*.parquet"), ".parquet", "ParquetSource")
    with pytest.raises(jl.ConfigError, match=r"'.*empty' is a folder with no \*.parquet file"):
        expand(tmp_path / "empty", ".parquet", "ParquetSource")
    with pytest.raises(jl.ConfigError, match="expected at least one path, got none"):
        expand([], ".parquet", "ParquetSource")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_a_fifo_or_a_device_among_the_paths_is_refused(tmp_path):
    # pyarrow's and array-record's opening of a FIFO waited for a writer, for good and deaf
    # to Ctrl-C; a device (/dev/zero) was read without end
    os.mkfifo(tmp_path / "part-1.parquet")
    for given in (tmp_path / "part-1.parquet", tmp_path, str(tmp_path / "part-*.parquet"),
                  f"file://{tmp_path}/part-1.parquet", f"file://{tmp_path}/part-*.parquet",
                  f"file://{tmp_path}"):  # (file:// passed the check; its pattern: KeyError)
        with pytest.raises(jl.ConfigError, match=r"ParquetSource\(paths\): '.*part-1.parquet' "
                                                 r"is a FIFO, not a regular file"):
            expand(given, ".parquet", "ParquetSource")
    with pytest.raises(jl.ConfigError, match="'/dev/zero' is a device"):
        expand("/dev/zero", ".tar", "Stream.tar")
    assert expand(str(tmp_path / "gone.parquet"), ".parquet", "X")  # (named where opened)


def test_file_sources_take_a_folder_or_a_pattern(tmp_path):
    for k in (1, 0):
        pq.write_table(pa.table({"id": np.arange(3) + 3 * k}), tmp_path / f"part-{k}.parquet")
    whole = jl.ParquetSource(tmp_path)
    assert whole.__getitems__(np.arange(6))["id"].tolist() == list(range(6))
    assert whole.fingerprint == jl.ParquetSource(str(tmp_path / "part-*.parquet")).fingerprint
    assert whole.fingerprint == jl.ParquetSource(f"file://{tmp_path}/part-*.parquet").fingerprint
    assert whole.fingerprint == jl.ParquetSource(f"file://{tmp_path}/part-?.parquet").fingerprint
    spaced = tmp_path / "a b"
    spaced.mkdir()
    pq.write_table(pa.table({"id": np.arange(2)}), spaced / "c.parquet")
    assert len(jl.ParquetSource(f"file://localhost{spaced}/c%2Eparquet".replace(" ", "%20"))) == 2
    assert whole.fingerprint == jl.ParquetSource(
        [str(tmp_path / "part-0.parquet"), str(tmp_path / "part-1.parquet")]).fingerprint
    pytest.importorskip("array_record")
    from array_record.python import array_record_module

    for k in (1, 0):
        writer = array_record_module.ArrayRecordWriter(str(tmp_path / f"r-{k}.array_record"),
                                                       "group_size:1")
        writer.write(f"record {k}".encode())
        writer.close()
    assert jl.ArrayRecordSource(tmp_path).__getitems__(np.arange(2)) == [b"record 0",
                                                                          b"record 1"]


def test_a_remote_pattern_lists_its_folder_through_epath(gcs):
    root, _ = gcs
    touch(root, "bucket/data/train-1.parquet", "bucket/data/train-0.parquet",
          "bucket/data/test-0.parquet")
    assert expand("gs://bucket/data/train-*.parquet", ".parquet", "S") == [
        "gs://bucket/data/train-0.parquet", "gs://bucket/data/train-1.parquet"]
    with pytest.raises(jl.ConfigError, match="a pattern in a folder's name"):
        expand("gs://bucket/*/train-*.parquet", ".parquet", "S")
    with pytest.raises(jl.ConfigError, match="matches no file"):
        expand("gs://bucket/data/valid-*.parquet", ".parquet", "S")
    with pytest.raises(jl.ConfigError, match=r"'gs://bucket/data/' is a folder; remote folders "
                                             r"are not listed: pass a pattern, "
                                             r"'gs://bucket/data/\*.parquet'"):
        jl.ParquetSource("gs://bucket/data/")
    with pytest.raises(jl.ConfigError, match=r"'gs://bucket/other' does not exist; check the "
                                             r"path; if it is a remote folder, pass a pattern"):
        jl.ParquetSource("gs://bucket/other")  # (a bucket's store may say so of a folder)
