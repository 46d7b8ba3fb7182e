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
    with pytest.raises(jl.ConfigError, match=r"'.*empty' is a folder with no \*.parquet file; "
                                             r"it holds 'notes.txt': to read them, pass a "
                                             r"pattern that matches them \(folder/\*\)"):
        expand(tmp_path / "empty", ".parquet", "ParquetSource")
    # a folder of TFDS's shards (x.array_record-00000-of-00002) was 'a folder with no
    # *.array_record file; check the path', naming none of them (the files audit)
    touch(tmp_path / "tfds", "x.array_record-00000-of-00002", "x.array_record-00001-of-00002")
    with pytest.raises(jl.ConfigError, match=r"it holds 'x.array_record-00000-of-00002', "
                                             r"'x.array_record-00001-of-00002': to read them"):
        expand(tmp_path / "tfds", ".array_record", "ArrayRecordSource")
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
    # names a local pattern leaves out: a dot first, a dataset's underscore (the same pattern
    # over a bucket read a checksum file and a job's temporary output; the file sources audit)
    touch(root, "bucket/data/.train-2.parquet.crc.parquet", "bucket/data/_train-3.parquet")
    assert [os.path.basename(p) for p in expand("gs://bucket/data/*train-*.parquet",
                                                ".parquet", "S", dataset=True)] == [
        "train-0.parquet", "train-1.parquet"]
    assert [os.path.basename(p) for p in expand("gs://bucket/data/_*.parquet", ".parquet", "S",
                                                dataset=True)] == ["_train-3.parquet"]
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


def test_a_file_listed_twice_is_refused_not_read_twice_a_pass(tmp_path):
    # a folder and a pattern over it, or one path written two ways, read each of its records
    # twice a pass without a word
    touch(tmp_path, "s-0.tar", "s-1.tar")
    for paths, by in (([tmp_path, str(tmp_path / "*.tar")], r"'.*re0' and by '.*\*.tar'"),
                      ([str(tmp_path / "s-0.tar"), str(tmp_path) + "/./s-0.tar"],
                       r"'.*s-0.tar' and by '.*/\./s-0.tar'"),
                      ([tmp_path, str(tmp_path) + "/"], r"'.*re0' and by '.*re0/'")):
        with pytest.raises(jl.ConfigError, match=r"Stream.tar\(paths\): '.*s-0.tar' is listed "
                                                 rf"twice, by {by}: its records would be read "
                                                 r"twice a pass; list each file once"):
            expand(paths, ".tar", "Stream.tar")
    assert len(expand([str(tmp_path / "s-0.tar"), str(tmp_path / "s-1.tar")], ".tar", "S")) == 2
    os.symlink(tmp_path / "s-0.tar", tmp_path / "copy.tar")  # (a link is a choice: two)
    assert len(expand([str(tmp_path / "s-0.tar"), str(tmp_path / "copy.tar")], ".tar", "S")) == 2


def test_braces_are_refused_as_the_source_is_made_not_at_its_first_read(tmp_path):
    # WebDataset's shard-{000..001}.tar was one path, missing, named at the first next()
    touch(tmp_path, "shard-000.tar", "shard-001.tar", "odd{0..1}.tar", "exp{a,b}/x.tar")
    for given in ("shard-{000..001}.tar", "shard-{000,001}.tar"):
        with pytest.raises(jl.ConfigError, match=r"has braces \(\{000(\.\.|,)001\}\), which "
                                                 r"are not expanded .*'shard-\*.tar'"):
            jl.Stream.tar(str(tmp_path / given))
    assert expand(str(tmp_path / "odd{0..1}.tar"), ".tar", "S") == [  # (a file so named)
        str(tmp_path / "odd{0..1}.tar")]
    assert expand(str(tmp_path / "exp{a,b}" / "*.tar"), ".tar", "S") == [  # (a folder so
        str(tmp_path / "exp{a,b}" / "x.tar")]  # named, in a pattern: the review)


def test_a_folder_lists_its_files_in_any_case_and_says_which_it_leaves_out(tmp_path):
    # shard-1.TAR and .tgz files were left out of a folder's shards, and a Parquet folder's
    # part-00000 (no suffix) or .parq files, all without a word
    touch(tmp_path / "t", "shard-0.tar", "shard-1.TAR", "shard-2.tgz", "shard-3.tar.gz",
          "notes.md", ".hidden")
    names = lambda paths: [os.path.relpath(p, tmp_path) for p in paths]  # noqa: E731
    with pytest.warns(UserWarning, match=r"Stream.tar\(paths\): files in a folder given are "
                                         r"left out, their names not ending with .tar or "
                                         r".*: '.*t/notes.md'; to read them, pass a pattern"):
        shards = jl.Stream.tar(tmp_path / "t").shards
    assert names(s.path for s in shards) == [
        "t/shard-0.tar", "t/shard-1.TAR", "t/shard-2.tgz", "t/shard-3.tar.gz"]
    touch(tmp_path / "p", "a.parquet", "b.PARQUET", "part-00000", "c.parq", "_SUCCESS",
          "_temporary/x")
    with pytest.warns(UserWarning, match=r"left out, .*: '.*p/c.parq', '.*p/part-00000'; "):
        assert names(expand(tmp_path / "p", ".parquet", "S", dataset=True)) == [
            "p/a.parquet", "p/b.PARQUET"]


def test_a_dataset_pattern_leaves_names_starting_with_underscore_out_as_a_folder_does(
        tmp_path, monkeypatch):
    # the Hive refusal's remedy, 'folder/**/*.parquet', read a Spark job's leftover
    # _temporary/ copy too (pyarrow and the folder's listing leave it out)
    touch(tmp_path / "h", "year=1/p.parquet", "year=2/p.parquet", "_temporary/0/p.parquet",
          "year=2/_temporary/p.parquet")
    names = lambda paths: [os.path.relpath(p, tmp_path) for p in paths]  # noqa: E731
    assert names(expand(str(tmp_path / "h" / "**" / "*.parquet"), ".parquet", "S",
                        dataset=True)) == ["h/year=1/p.parquet", "h/year=2/p.parquet"]
    assert len(expand(str(tmp_path / "h" / "**" / "*.parquet"), ".parquet", "S")) == 4
    assert names(expand(str(tmp_path / "h" / "_temporary" / "*" / "*.parquet"), ".parquet", "S",
                        dataset=True)) == ["h/_temporary/0/p.parquet"]  # (named: read)
    assert names(expand(str(tmp_path / "h" / "_tempor*" / "*" / "*.parquet"), ".parquet", "S",
                        dataset=True)) == ["h/_temporary/0/p.parquet"]  # (named by a pattern)
    # a relative pattern under a working folder whose own name starts with _ (the review:
    # its parents counted, "matches no file")
    touch(tmp_path / "_scratch" / "run", "a.parquet")
    monkeypatch.chdir(tmp_path / "_scratch" / "run")
    for pattern in ("*.parquet", "**/*.parquet"):
        assert expand(pattern, ".parquet", "S", dataset=True) == [
            os.path.join(os.getcwd(), "a.parquet")]  # (absolute: as found from here)


def test_a_folder_with_links_in_itself_lists_each_file_once(tmp_path):
    # a walk that follows links read data/latest -> v2 beside v2 twice a pass, a link to the
    # folder itself forty times; runs/latest/../x (where the link goes) was taken for runs/x
    # (the seventeenth review)
    touch(tmp_path / "data", "v2/part-0.parquet")
    os.symlink("v2", tmp_path / "data" / "latest")
    os.symlink(".", tmp_path / "data" / "again")
    names = lambda paths: [os.path.relpath(p, tmp_path) for p in paths]  # noqa: E731
    assert names(expand(tmp_path / "data", ".parquet", "S")) == ["data/v2/part-0.parquet"]
    touch(tmp_path / "outside", "o.parquet")
    os.symlink(tmp_path / "outside", tmp_path / "data" / "out")  # (a link out: followed)
    assert names(expand(tmp_path / "data", ".parquet", "S")) == [
        "data/out/o.parquet", "data/v2/part-0.parquet"]
    touch(tmp_path / "runs", "2024/sub/x.parquet", "2024/shared.parquet", "shared.parquet")
    os.symlink("2024/sub", tmp_path / "runs" / "latest")
    both = [str(tmp_path / "runs" / "latest" / ".." / "shared.parquet"),
            str(tmp_path / "runs" / "shared.parquet")]
    assert expand(both, ".parquet", "S") == both  # (two files: 2024's and runs')
    touch(tmp_path / "d", ".versions/v3/p.parquet", "_staging/s.parquet", "extra/e.parquet")
    os.symlink(".versions/v3", tmp_path / "d" / "current")  # (its only way in: the walk
    os.symlink("_staging", tmp_path / "d" / "latest")  # leaves .versions out; a dataset _)
    assert names(expand(tmp_path / "d", ".parquet", "S")) == [
        "d/_staging/s.parquet", "d/current/p.parquet", "d/extra/e.parquet"]
    assert names(expand(tmp_path / "d", ".parquet", "S", dataset=True)) == [
        "d/current/p.parquet", "d/extra/e.parquet", "d/latest/s.parquet"]
    os.symlink(".versions/v3", tmp_path / "d" / "stable")  # (two links to one hidden folder,
    os.symlink("..", tmp_path / "d" / ".versions" / "v3" / "up")  # one back to its parent:
    assert names(expand(tmp_path / "d", ".parquet", "S")) == [  # each file once; the review)
        "d/_staging/s.parquet", "d/current/p.parquet", "d/extra/e.parquet"]
    os.mkdir(tmp_path / "exp{a,b}")  # (a folder named with braces, of no such file)
    with pytest.raises(jl.ConfigError, match=r"is a folder with no \*.parquet file"):
        expand(str(tmp_path / "exp{a,b}"), ".parquet", "S")


def test_a_pattern_over_links_to_one_folder_lists_its_files_once_by_their_first_names(tmp_path):
    # a folder's walk listed them once, and a pattern over it (the Hive refusal's own remedy)
    # refused them as 'listed twice, by d/**/*.parquet and by d/**/*.parquet'; of two links,
    # the walk kept the name of the shallower, not the first in name order (the twentieth
    # review)
    touch(tmp_path / "d", ".versions/v3/p.parquet", "extra/e.parquet")
    os.symlink(".versions/v3", tmp_path / "d" / "current")
    os.symlink(".versions/v3", tmp_path / "d" / "stable")
    names = lambda paths: [os.path.relpath(p, tmp_path) for p in paths]  # noqa: E731
    for given in ("d", "d/**/*.parquet", "d/*/*.parquet"):
        for dataset in (False, True):
            assert names(expand(str(tmp_path / given), ".parquet", "S", dataset=dataset)) == [
                "d/current/p.parquet", "d/extra/e.parquet"], (given, dataset)
    with pytest.raises(jl.ConfigError, match="listed twice"):  # (two listings: as before)
        expand([str(tmp_path / "d"), str(tmp_path / "d/*/p.parquet")], ".parquet", "S")
    touch(tmp_path / "f", ".v/p.parquet", "a/keep.parquet")
    os.symlink("../.v", tmp_path / "f" / "a" / "cur")
    os.symlink(".v", tmp_path / "f" / "z")
    assert names(expand(tmp_path / "f", ".parquet", "S")) == [
        "f/a/cur/p.parquet", "f/a/keep.parquet"]
    touch(tmp_path / "g", "v2/x.parquet")  # (a file's own path, where the pattern reaches it,
    os.symlink("v2", tmp_path / "g" / "latest")  # as the walk names it; not 40 links deep:
    os.symlink(".", tmp_path / "g" / "self")  # the twenty-first review)
    os.symlink("g", tmp_path / "via")  # (and where the folder given is a link itself: a
    for given in ("g", "g/**/*.parquet", "via", "via/**/*.parquet"):  # cluster's scratch
        assert [os.path.basename(os.path.dirname(p)) for p in expand(  # link; the twenty-
            str(tmp_path / given), ".parquet", "S")] == ["v2"], given  # second review)


@pytest.mark.timeout(60)
def test_a_double_star_pattern_over_links_to_parents_returns_each_file_once(tmp_path,
                                                                          monkeypatch):
    # glob's ** followed links for ever: two back to parents under d/ and d/**/*.jsonl never
    # returned (the hostile-input audit); one made each file ~40 names deep, then dropped
    touch(tmp_path / "d", "sub/x.jsonl", "sub/deeper/y.jsonl", "top.jsonl", ".cache/h.jsonl")
    os.symlink("..", tmp_path / "d" / "sub" / "up")
    os.symlink(".", tmp_path / "d" / "sub" / "self")
    names = lambda paths: [os.path.relpath(p, tmp_path) for p in paths]  # noqa: E731
    assert names(expand(str(tmp_path / "d" / "**" / "*.jsonl"), ".jsonl", "S")) == [
        "d/sub/deeper/y.jsonl", "d/sub/x.jsonl", "d/top.jsonl"]
    assert names(expand(str(tmp_path / "d" / "**" / "deeper" / "*.jsonl"), ".jsonl", "S")) == [
        "d/sub/deeper/y.jsonl"]
    assert names(expand(str(tmp_path / "d" / "**"), ".jsonl", "S")) == [
        "d/sub/deeper/y.jsonl", "d/sub/x.jsonl", "d/top.jsonl"]
    assert names(expand(str(tmp_path / "d" / ".cache" / "**" / "*.jsonl"), ".jsonl", "S")) == [
        "d/.cache/h.jsonl"]  # (a hidden part named: as glob gives it)
    monkeypatch.chdir(tmp_path / "d")  # (a relative pattern: its files as glob names them)
    assert names(expand("**/*.jsonl", ".jsonl", "S")) == [
        "d/sub/deeper/y.jsonl", "d/sub/x.jsonl", "d/top.jsonl"]
    assert names(expand("**", ".jsonl", "S")) == [  # (it named the folder here as "", whose
        "d/sub/deeper/y.jsonl", "d/sub/x.jsonl", "d/top.jsonl"]  # relpath raised ValueError)
    assert jl.Stream.jsonl(str(tmp_path / "d" / "**" / "*.jsonl")) is not None


def test_a_double_star_pattern_lists_what_glob_lists_where_no_link_loops(tmp_path, monkeypatch):
    # the walk first missed a pattern naming a link into the tree (runs/**/latest/*.jsonl)
    # and a "/" last (x/**/), which glob matched (the review)
    import glob

    from jaxloader.sources import paths

    touch(tmp_path / "runs", "exp/v1/a.jsonl", "exp/v2/b.jsonl", "exp/v2/deep/c.jsonl",
          "top.jsonl", "other/d.jsonl")
    os.symlink("v2", tmp_path / "runs" / "exp" / "latest")
    touch(tmp_path / "outside", "o.jsonl")
    os.symlink(tmp_path / "outside", tmp_path / "runs" / "out")
    touch(tmp_path / "runs", "shared/s.jsonl")  # (a link under a link: exp1/latest/ext/...)
    touch(tmp_path / "ext", "e.jsonl")
    os.symlink("../shared", tmp_path / "runs" / "exp" / "shared_latest")
    os.symlink("../../ext", tmp_path / "runs" / "shared" / "ext")
    monkeypatch.chdir(tmp_path)
    patterns = ["runs/**/*.jsonl", "runs/**/latest/*.jsonl", "**/latest/*.jsonl",
                "runs/**/latest/**/*.jsonl", "runs/**/", "runs/**", "runs/exp/**/c.jsonl",
                "runs/**/v*/*.jsonl", "**/out/*.jsonl", "runs/exp*/**/*.jsonl",
                "runs/exp/shared_latest/**/e.jsonl", "**/ext/*.jsonl",
                str(tmp_path / "runs" / "**" / "*.jsonl"),
                str(tmp_path / "runs" / "**" / "latest" / "*.jsonl")]
    walked = {p: expand(p, ".jsonl", "S") for p in patterns}
    monkeypatch.setattr(paths, "pattern_matches", lambda p, o, r: glob.glob(p, recursive=True))
    for pattern in patterns:
        assert walked[pattern] == expand(pattern, ".jsonl", "S"), pattern


def test_a_folder_that_cannot_be_listed_is_said_not_left_out_without_a_word(tmp_path,
                                                                            monkeypatch):
    # (os.walk's default; a disk's root holds lost+found, root's alone: left out unsaid,
    # where refusing it failed every data disk's listing: the twenty-first review)
    touch(tmp_path / "d", "a/x.parquet", "b/y.parquet", "lost+found/z")
    listed = os.scandir

    def scandir(path):
        if os.path.basename(path) in ("b", "lost+found", "e"):
            raise PermissionError(13, "Permission denied", path)
        return listed(path)
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.warns(jl.JaxloaderWarning) as said:
        found = expand(tmp_path / "d", ".parquet", "S")
    assert [os.path.relpath(f, tmp_path) for f in found] == ["d/a/x.parquet"]
    assert [str(w.message) for w in said if "cannot be listed" in str(w.message)] == [
        f"S(paths): the folder {str(tmp_path / 'd' / 'b')!r} cannot be listed (Permission "
        "denied): its files are left out; make it readable, or pass a pattern or the files' "
        "paths"]
    (tmp_path / "e").mkdir()
    with pytest.raises(jl.ConfigError, match=r"folder '.*e' cannot be listed \(Permission"):
        expand(tmp_path / "e", ".parquet", "S")


def test_a_walk_looks_up_real_paths_of_links_only(tmp_path, monkeypatch):
    # each folder's real path was looked up, a call a part of its path (20,000 folders: 60%
    # slower than the walk before; the twentieth review)
    touch(tmp_path / "d", *[f"{i}/{j}/x.parquet" for i in range(5) for j in range(5)])
    os.symlink("0", tmp_path / "d" / "link")
    calls = []
    real = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda p, **k: calls.append(p) or real(p, **k))
    assert len(expand(tmp_path / "d", ".parquet", "S")) == 25
    assert len(calls) <= 8, calls


def test_a_configs_unexpanded_home_or_variable_and_a_dict_of_splits_are_named(tmp_path):
    # '~/data/*.parquet' "matched no file", '$DATA/pq' "does not exist", and a dict of splits
    # was read as its keys ("file 'train' does not exist") (the config audit)
    for path in ("~/no-such-data/*.parquet", "$NO_SUCH_DATA/pq", "${NO_SUCH_DATA}/x.parquet"):
        with pytest.raises(jl.ConfigError, match=r"names no file; its ~ or \$NAME is a shell's, "
                                                 r"not expanded: pass os.path.expandvars"):
            expand(path, ".parquet", "S")
    with pytest.raises(jl.ConfigError, match=r"got a dict of \['train'\]; pass one entry's"):
        expand({"train": str(tmp_path / "a.parquet")}, ".parquet", "S")
    touch(tmp_path, "$x.parquet")  # (a file so named: itself)
    assert expand(str(tmp_path / "$x.parquet"), ".parquet", "S") == [str(tmp_path / "$x.parquet")]


def test_relative_paths_are_read_from_where_they_were_given(tmp_path, monkeypatch):
    # kept as given, a relative path was opened from each worker's folder: a Ray actor's (its
    # own, or another node's) or, here, workers started after an os.chdir: "check the path"
    # of a file that is there (the Ray streams audit)
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"x": np.arange(8)}), data / "t.parquet")
    (data / "a.jsonl").write_text("".join(f'{{"x": {i}}}\n' for i in range(8)))
    monkeypatch.chdir(data)
    source = jl.ParquetSource("t.parquet")
    stream = jl.Stream.jsonl(["a.jsonl"])
    assert source.paths == [str(data / "t.parquet")] and os.path.isabs(stream.shards[0].name)
    monkeypatch.chdir(tmp_path)
    with jl.DataLoader(source, batch_size=4, num_workers=2, process_index=0,
                       process_count=1) as loader:
        assert sorted(np.concatenate([b["x"] for b in loader]).tolist()) == list(range(8))
    with jl.StreamLoader(stream, batch_size=4, num_workers=1, num_epochs=1, process_index=0,
                         process_count=1) as loader:
        assert sorted(np.concatenate([b["x"] for b in loader]).tolist()) == list(range(8))
    # a FileListSource's too: after the os.chdir, another folder's files of the same names
    # were read, without a word (the file sources audit); a record's "path" stays as given
    (data / "img").mkdir()
    (tmp_path / "img").mkdir()
    for i in range(4):
        (data / "img" / f"{i}.bin").write_bytes(b"data-%d" % i)
        (tmp_path / "img" / f"{i}.bin").write_bytes(b"other-%d" % i)
    monkeypatch.chdir(data)
    files = jl.FileListSource([f"img/{i}.bin" for i in range(4)])
    monkeypatch.chdir(tmp_path)
    for workers in (0, 2):
        with jl.DataLoader(files, batch_size=4, num_workers=workers, process_index=0,
                           process_count=1) as loader:
            batch = next(iter(loader))
        assert batch["data"].tolist() == [b"data-%d" % i for i in range(4)], workers
        assert batch["path"].tolist() == [f"img/{i}.bin" for i in range(4)]
    # not there (a Ray actor on another node, its working_dir a copy of the files): read as
    # given, from the folder the reader runs in (it failed there; the second review)
    os.rename(data / "img", data / "moved")
    assert files[1]["data"] == b"other-1"
    monkeypatch.chdir(data)
    with pytest.raises(OSError, match=r"FileListSource: cannot read file '.*img/1.bin' "):
        files[1]
