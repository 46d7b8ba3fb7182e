"""Compressed shards: gzip, bzip2, xz and Zstandard read as what they hold, resumed exactly."""

from __future__ import annotations

import bz2
import gc
import gzip
import io
import json
import lzma
import warnings

import cloudpickle
import pytest

import jaxloader as jl
from jaxloader.streams import compressed
from streams.test_shards import read_all, write_jsonl, write_tar

zstd = compressed._zstd_module("the tests")  # backports.zstd is in the test extra

WRITE = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
         ".zst": zstd.compress}


def compress(path, suffix):
    """``path`` compressed into ``path + suffix`` (the plain file removed)."""
    packed = path.with_name(path.name + suffix)
    packed.write_bytes(WRITE[suffix](path.read_bytes()))
    path.unlink()
    return packed


@pytest.mark.parametrize("suffix", list(WRITE))
@pytest.mark.parametrize("kind", ["jsonl", "text", "tar"])
def test_a_compressed_shard_reads_and_resumes_as_the_plain_one(tmp_path, kind, suffix):
    ids = list(range(40))
    write, make = {"jsonl": (write_jsonl, jl.JsonlShard), "text": (write_jsonl, jl.TextShard),
                   "tar": (write_tar, jl.TarShard)}[kind]
    plain = write(tmp_path / f"a.{kind}", ids)
    everything = read_all(make(plain))
    packed = compress(write(tmp_path / f"b.{kind}", ids), suffix)
    assert compressed.compression(open(packed, "rb")) is not None
    shard = make(packed)
    assert read_all(shard) == everything and len(everything) == 40
    for k in (1, 17, 40):
        shard.reset(None)
        for _ in range(k):
            shard.next()
        state = json.loads(json.dumps(shard.get_state()))
        fresh = cloudpickle.loads(cloudpickle.dumps(shard))  # as a worker gets it
        assert read_all(fresh, state) == everything[k:], k


@pytest.mark.parametrize("suffix", [".gz", ".xz"])
def test_a_compressed_shards_state_past_its_end_is_refused_not_resumed_at_its_end(tmp_path,
                                                                                  suffix):
    # a plain file's size is known and such an offset was refused; a compressed one's is
    # known only by reading, and the edited state resumed at its end: its records skipped
    packed = compress(write_jsonl(tmp_path / "a.jsonl", range(10)), suffix)
    shard = jl.JsonlShard(packed)
    shard.reset(None)
    shard.next()
    state = shard.get_state()
    end = dict(state, offset=len(_decompressed(packed)))
    assert read_all(jl.JsonlShard(packed), end) == []  # (its end: a place)
    with pytest.raises(jl.StateDictError, match=rf"offset {end['offset'] + 1} is past its end "
                                                rf"\({end['offset']:,} bytes read to it, "
                                                r"decompressed\), where no read of it stops"):
        read_all(jl.JsonlShard(packed), dict(state, offset=end["offset"] + 1))


def _decompressed(path):
    return (gzip.decompress if path.suffix == ".gz" else lzma.decompress)(path.read_bytes())


def test_the_format_is_told_by_the_first_bytes_not_the_name(tmp_path):
    named = tmp_path / "plain.jsonl.gz"  # not compressed, whatever its name says
    named.write_text('{"id": 1}\n')
    assert read_all(jl.JsonlShard(named)) == [{"id": 1}]
    hidden = tmp_path / "packed.jsonl"
    hidden.write_bytes(gzip.compress(b'{"id": 2}\n'))
    assert read_all(jl.JsonlShard(hidden)) == [{"id": 2}]
    text = tmp_path / "bzh.txt"  # begins like bzip2's magic, but is text
    text.write_text("BZh9 is a block size\n")
    assert read_all(jl.TextShard(text)) == ["BZh9 is a block size"]
    pzstd = tmp_path / "pz.jsonl.zst"  # (pzstd's: a skippable frame first, its sizes; read
    pzstd.write_bytes(b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"\x01\x00\x00\x00"
                      + zstd.compress(b'{"id": 3}\n'))  # as plain bytes: "not JSON")
    assert read_all(jl.JsonlShard(pzstd)) == [{"id": 3}]


@pytest.mark.parametrize("suffix", list(WRITE))
def test_an_empty_compressed_shard_holds_no_records(tmp_path, suffix):
    # bzip2 writes an empty file as its magic and the end of the stream, with no block: it
    # was read as text, and raised a UnicodeDecodeError
    empty = compress(write_jsonl(tmp_path / "empty.jsonl", []), suffix)
    assert compressed.compression(open(empty, "rb")) is not None
    assert read_all(jl.JsonlShard(empty)) == []
    assert read_all(jl.TextShard(empty)) == []
    parts = [compress(write_jsonl(tmp_path / f"p{s}.jsonl", range(5 * s, 5 * s + 5)), suffix)
             for s in range(2)]
    stream = jl.Stream.jsonl([parts[0], empty, parts[1]], shuffle_shards=False)
    with jl.StreamLoader(stream, batch_size=5, num_epochs=1, process_index=0,
                         process_count=1) as loader:
        ids = sorted(i for batch in loader for i in batch["id"][batch["mask"]].tolist())
    assert ids == list(range(10))


def test_a_folder_lists_compressed_files_and_a_stream_reads_them(tmp_path):
    for s, suffix in enumerate(["", ".gz", ".zst"]):
        path = write_jsonl(tmp_path / f"part-{s}.jsonl", range(10 * s, 10 * s + 10))
        if suffix:
            compress(path, suffix)
    stream = jl.Stream.jsonl(tmp_path, shuffle_shards=False)
    assert [s.name.rsplit("/", 1)[-1] for s in stream.shards] == [
        "part-0.jsonl", "part-1.jsonl.gz", "part-2.jsonl.zst"]
    with jl.StreamLoader(stream, batch_size=10, num_workers=2, process_index=0,
                         process_count=1) as loader:
        it = iter(loader)
        ids = sorted(i for _ in range(3) for i in next(it)["id"].tolist())
    assert ids == list(range(30))


def test_a_file_cut_short_names_the_shard_and_the_line(tmp_path):
    path = compress(write_jsonl(tmp_path / "a.jsonl", range(2000)), ".gz")
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # a download that stopped
    shard = jl.JsonlShard(path)
    with pytest.raises(jl.RecordError, match=r"a.jsonl.gz: line \d+: cannot be read "
                                             r"\(EOFError: .*is the file whole"):
        read_all(shard)
    cut = jl.JsonlShard(path)  # a restore past where the file stops
    with pytest.raises(jl.RecordError, match=r"a.jsonl.gz: byte 90000 \(a restore's place\): "
                                             r"cannot be read \(EOFError"):
        cut.reset({"offset": 90_000, "line": 0})
    tar = compress(write_tar(tmp_path / "a.tar", range(200)), ".xz")
    tar.write_bytes(tar.read_bytes()[:-200])
    with pytest.raises(jl.RecordError, match=r"a.tar.xz: the member after record \d+: cannot "
                                             r"be read \(EOFError"):
        read_all(jl.TarShard(tar))


@pytest.mark.parametrize("suffix", list(WRITE))
def test_streams_one_after_another_are_read_and_bytes_after_them_refused(tmp_path, suffix):
    # pbzip2's files, `cat a.xz b.xz`: read whole; the second stream's start damaged, or lines
    # appended uncompressed: bz2's and lzma's readers dropped them and every record after, a
    # pass read 1000 records of 2000 without a word (gzip and Zstandard refuse them)
    lines = [write_jsonl(tmp_path / f"{part}.jsonl", range(part * 1000, part * 1000 + 1000))
             .read_bytes() for part in (0, 1)]
    first, second = (WRITE[suffix](part) for part in lines)
    path = tmp_path / f"a.jsonl{suffix}"
    for padding in (b"", b"\0" * 20_000)[:1 if suffix == ".zst" else 2]:  # (zeros between
        path.write_bytes(first + padding + second + padding)  # and after streams: padding, as
        # gzip, bzip2 and xz take them; Zstandard's reader refuses them)
        whole = jl.JsonlShard(path)
        assert [r["id"] for r in read_all(whole)] == list(range(2000))
        whole.close()
    for after in (second[:1] + bytes([second[1] ^ 0xFF]) + second[2:], lines[1]):
        path.write_bytes(first + after)
        shard = jl.JsonlShard(path)
        with pytest.raises(jl.RecordError, match=rf"a.jsonl\{suffix}: line 1001: cannot be read"):
            read_all(shard)
        shard.close()  # (its file: open after the error, as a loader closes it)


@pytest.mark.parametrize("suffix", [".gz", ".zst", ".xz"])
def test_a_compressed_tar_whose_bytes_changed_fails_its_checksum_not_gives_wrong_records(
        tmp_path, suffix):
    # a tar holds no checksum of its data, and the reader stopped at its end-of-archive marker,
    # before the compressed stream's own (checked as its end is read): gzip's data with one
    # bit flipped, stored (level 0) so that it decompresses, gave a wrong record, without a word
    plain = write_tar(tmp_path / "a.tar", range(50))
    whole = plain.read_bytes()
    level = {".gz": lambda b: gzip.compress(b, compresslevel=0),
             ".zst": lambda b: zstd.compress(
                 b, options={zstd.CompressionParameter.checksum_flag: 1}),
             ".xz": lambda b: lzma.compress(b, preset=0)}[suffix]
    packed = bytearray(level(whole))
    if suffix == ".gz":  # a byte of a member's data, in the stored block
        at = packed.index(b"text 7")
    else:  # a byte inside the compressed data
        at = len(packed) // 2
    packed[at] ^= 0x01
    path = tmp_path / f"a.tar{suffix}"
    path.write_bytes(bytes(packed))
    with pytest.raises(jl.RecordError, match=rf"a.tar{suffix}: .*(cannot be read|not a tar "
                                             r"header|fails its checksum)"):
        read_all(jl.TarShard(path))


def test_a_small_gzip_file_whose_crc_fails_is_damaged_not_unopenable(tmp_path):
    # its whole content read as the identity's first KiB: "cannot open ...; check the path"
    path = compress(write_jsonl(tmp_path / "a.jsonl", range(5)), ".gz")
    packed = bytearray(path.read_bytes())
    packed[-8] ^= 0x01  # the CRC-32 in the trailer
    path.write_bytes(bytes(packed))
    with pytest.raises(jl.RecordError, match=r"a.jsonl.gz: its first KiB: cannot be read "
                                             r"\(BadGzipFile: CRC check failed.*is the file "
                                             r"whole\? replace it"):
        jl.JsonlShard(path).reset()


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_a_small_file_cut_short_is_named_and_closed(tmp_path, suffix):
    # cut inside its first KiB: a bare EOFError from the identity's read, and the file left open
    path = compress(write_jsonl(tmp_path / "a.jsonl", range(40)), suffix)
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        with pytest.raises(jl.RecordError, match=rf"a.jsonl{suffix}: its first KiB: cannot be "
                                                 r"read \(EOFError.*is the file whole"):
            jl.JsonlShard(path).reset()
        gc.collect()  # (an unclosed file warns as it is collected)


def test_zstandard_without_its_module_says_what_to_install(tmp_path, monkeypatch):
    path = compress(write_jsonl(tmp_path / "a.jsonl", range(3)), ".zst")
    real = compressed.importlib.import_module

    def without_zstd(name, *args):
        if name.endswith("zstd"):
            raise ImportError(name)
        return real(name, *args)

    monkeypatch.setattr(compressed.importlib, "import_module", without_zstd)
    with pytest.raises(jl.ConfigError, match=r"a.jsonl.zst' is compressed with Zstandard.*"
                                             r"pip install \"jaxloader\[zstd\]\""):
        jl.JsonlShard(path).reset()


def test_a_gzip_reader_tells_offsets_in_what_it_holds_and_closes_its_file():
    raw = io.BytesIO(gzip.compress(b"a\nbb\nccc\n"))
    f = compressed.decompressed(raw, "x.gz")
    assert [f.readline(), f.tell()] == [b"a\n", 2]
    f.seek(5)
    assert f.readline() == b"ccc\n"
    f.close()
    assert raw.closed  # gzip.GzipFile(fileobj=) leaves it open


def test_a_small_compressed_append_only_file_that_grew_resumes(tmp_path):
    # its identity's head was the CRC of what it held (66 bytes), compared with the first KiB
    # of what it holds now: never the same, refused as "shorter or rewritten" (the streams
    # audit)
    path = str(tmp_path / "log.jsonl.gz")

    def add(numbers):
        with gzip.open(path, "ab") as f:
            f.write("".join(json.dumps({"i": i}) + "\n" for i in numbers).encode())

    def loader():
        return jl.StreamLoader(jl.Stream.jsonl(path, append_only=True), batch_size=2,
                               process_index=0, process_count=1)
    add(range(10))
    with loader() as first:
        it = iter(first)
        next(it), next(it)
        state = first.state_dict()
        expected = [next(it)["i"].tolist() for _ in range(3)]
    add(range(10, 200))
    with loader() as again:
        again.load_state_dict(state)
        it = iter(again)
        assert [next(it)["i"].tolist() for _ in range(3)] == expected
