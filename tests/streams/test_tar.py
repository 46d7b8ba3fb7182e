"""TarShard: headers as tarfile writes them (ustar, GNU, pax); other files refused by name."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import tempfile
import warnings
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxloader as jl
from jaxloader.streams.tar import _SMALL
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


def test_a_gnu_headers_times_are_not_taken_for_a_name_prefix(tmp_path):
    # GNU tar -G writes a member's access and change times where a POSIX header has its
    # name's prefix: every key began with "15305566655/" (the stream audit)
    path = tmp_path / "gnu.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in (("./k1.txt", b"a"), ("./k2.txt", b"b")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = bytearray(path.read_bytes())
    for header in (0, 1024):
        assert raw[header + 257:header + 265] == b"ustar  \0"
        raw[header + 345:header + 357] = b"15305566655\0"  # (the access time, as -G writes)
        raw[header + 148:header + 156] = b" " * 8
        raw[header + 148:header + 156] = b"%06o\0 " % sum(raw[header:header + 512])
    path.write_bytes(bytes(raw))
    assert [r["__key__"] for r in read_all(jl.TarShard(path))] == ["./k1", "./k2"]


def test_a_pax_size_is_the_members_size_as_written_for_members_over_8_gib(tmp_path):
    # tarfile and GNU tar write a member over 8 GiB with its size in a pax header and 0 in
    # its ustar field: made so here with a small member
    path = tmp_path / "pax.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("k1.bin", b"hello"), ("k2.bin", b"abc")):
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = len(data), {"size": str(len(data))}
            tar.addfile(info, io.BytesIO(data))
    raw = bytearray(path.read_bytes())
    header = 1024  # after the pax header and its data
    assert raw[header:header + 6] == b"k1.bin"
    raw[header + 124:header + 136] = b"00000000000\0"
    raw[header + 148:header + 156] = b" " * 8
    raw[header + 148:header + 156] = b"%06o\0 " % sum(raw[header:header + 512])
    path.write_bytes(bytes(raw))
    with tarfile.open(path) as tar:  # (what tarfile reads)
        assert tar.extractfile("k1.bin").read() == b"hello"
    assert read_all(jl.TarShard(path)) == [{"__key__": "k1", "bin": b"hello"},
                                           {"__key__": "k2", "bin": b"abc"}]
    at = raw.index(b"size=5")
    raw[at:at + 6] = b"size=x"  # (a pax header's data has no checksum)
    path.write_bytes(bytes(raw))
    with pytest.raises(jl.RecordError, match=r"pax.tar: byte 0: a pax header's size is b'x'"):
        read_all(jl.TarShard(path))
    raw[at:at + 7] = b"size=-5"  # (over its line break: the header's 9 bytes end at the 5;
    # it was the bare "read length must be non-negative or -1", naming no member)
    path.write_bytes(bytes(raw))
    with pytest.raises(jl.RecordError, match=r"pax.tar: byte 0: a pax header's size is b'-5'"):
        read_all(jl.TarShard(path))


def test_a_sparse_member_is_refused_by_name_not_dropped_or_read_packed(tmp_path):
    # GNU tar --sparse: its 'S' member was passed over (the record lost a field), and in pax
    # form read as its packed bytes under a made-up name (./GNUSparseFile.123/...)
    for fmt, sparse in ((tarfile.GNU_FORMAT, {"type": tarfile.GNUTYPE_SPARSE}),
                        (tarfile.PAX_FORMAT, {"pax_headers": {"GNU.sparse.major": "1",
                                                              "GNU.sparse.minor": "0"}})):
        path = tmp_path / f"sparse-{fmt}.tar"
        with tarfile.open(path, "w", format=fmt) as tar:
            for name, extra in (("k1.cls", {}), ("k1.bin", sparse)):
                info = tarfile.TarInfo(name)
                info.size = 4
                for key, value in extra.items():
                    setattr(info, key, value)
                tar.addfile(info, io.BytesIO(b"data"))
        with pytest.raises(jl.RecordError, match=r"sparse-\d.tar: byte \d+: member '(k1.bin|"
                                                 r"after it)' is a sparse file \(tar --sparse\)"
                                                 r".*re-create the shard without --sparse"):
            read_all(jl.TarShard(path))


def test_a_member_written_twice_is_an_error_not_one_of_them_lost(tmp_path):
    path = tmp_path / "twice.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in (("k1.txt", b"first"), ("k1.txt", b"second"), ("k1.cls", b"3")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    shard = jl.TarShard(path)
    shard.reset()
    with pytest.raises(jl.RecordError, match=r"twice.tar: byte 1024: member k1.txt follows "
                                             r"another of the same name"):
        shard.next()


def test_a_samples_members_stored_apart_are_an_error_not_records_each_half_empty(tmp_path):
    # members written by extension (a.cls b.cls a.txt b.txt) were read as four records, each
    # lacking the other's extension: with a Map that decodes with r.get, twice the samples,
    # each half empty, without a word (ray-project/ray#44068)
    path = tmp_path / "apart.tar"
    with tarfile.open(path, "w") as tar:
        for name in ("a.cls", "b.cls", "a.txt", "b.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    shard = jl.TarShard(path)
    shard.reset()
    assert [shard.next()["__key__"] for _ in range(2)] == ["a", "b"]
    state = shard.get_state()
    with pytest.raises(jl.RecordError, match=r"apart.tar: byte 2048: member a.txt has the key "
                                             r"of a record before it, apart from its members"):
        shard.next()
    shard.reset()  # (a pass anew: the keys read before it are not this pass's)
    assert shard.next() == {"__key__": "a", "cls": b"1"}
    shard.reset(state)  # (a restore knows the keys read from its place on only)
    assert shard.next() == {"__key__": "a", "txt": b"1"}
    tolerant = jl.Map(lambda r: {"key": r["__key__"], "txt": r.get("txt", b"")})
    with jl.StreamLoader(jl.Stream.tar(str(path)), batch_size=2, num_epochs=1,
                         transforms=[tolerant]) as loader:
        with pytest.raises(jl.RecordError, match="member a.txt has the key"):
            list(loader)


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


# -- damage is an error, never a short record -------------------------------------------------
def _archive(records, fmt=tarfile.GNU_FORMAT):
    """A tar (bytes) of ``records`` (key, [(ext, data)]), and each member's
    (header offset, end of its data, end of its padding)."""
    buffer = io.BytesIO()
    spans = []
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for key, members in records:
            for ext, data in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                start = buffer.tell()
                tar.addfile(info, io.BytesIO(data))
                end = buffer.tell()
                spans.append((start, end - (-len(data) % 512), end))
    return buffer.getvalue(), spans


def _tarfile_records(path):
    """What tarfile reads of ``path``, grouped into records as TarShard groups them."""
    out = []
    with tarfile.open(path, "r:*") as tar:
        for member in tar:
            stem, _, ext = member.name.partition(".")
            data = tar.extractfile(member).read()
            if out and out[-1]["__key__"] == stem:
                out[-1][ext] = data
            else:
                out.append({"__key__": stem, ext: data})
    return out


_names = st.text("abcdefghij", min_size=1, max_size=6)
_data = st.one_of(st.binary(max_size=1300),  # and larger than a small member's one read
                  st.builds(lambda n, b: bytes([b]) * n, st.integers(4000, 9000),
                            st.integers(0, 255)))
_records = st.lists(
    st.tuples(_names, st.lists(st.tuples(st.sampled_from(["txt", "cls", "bin"]), _data),
                               min_size=1, max_size=3, unique_by=lambda m: m[0])),
    min_size=1, max_size=5, unique_by=lambda r: r[0])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=_records, fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT,
                                              tarfile.PAX_FORMAT]),
       gzipped=st.booleans())
def test_a_tar_cut_anywhere_is_read_whole_or_refused_never_short(records, fmt, gzipped):
    """Against tarfile: the whole archive reads as tarfile reads it; cut at every member
    boundary and inside every header, data and padding, it is an error naming the shard and a
    byte offset (or, with tolerate_missing_end and a cut at a member boundary or inside the
    end-of-archive marker, exactly the members before the cut, as tarfile reads them). The
    same inside a gzip file (the tar cut, then compressed: a size known only by reading)."""
    whole, spans = _archive(records, fmt)
    end_marker = spans[-1][2]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "s.tar")

        def write(data):
            with open(path, "wb") as f:
                f.write(gzip.compress(data) if gzipped else data)

        write(whole)
        expected = _tarfile_records(path)
        assert read_all(jl.TarShard(path)) == expected
        cuts = {end_marker + 512, end_marker + 1023}
        for start, data_end, padded_end in spans:
            cuts |= {start, start + 100, start + 511, (start + 512 + data_end) // 2,
                     data_end, data_end + 1, padded_end - 1, padded_end}
        for cut in sorted(c for c in cuts if 0 < c < end_marker + 1024):
            write(whole[:cut])
            boundary = cut in {s for s, _, _ in spans[1:]} or cut >= end_marker
            for tolerate in (False, True):
                shard = jl.TarShard(path, tolerate_missing_end=tolerate)
                if tolerate and boundary:
                    assert read_all(shard) == _tarfile_records(path), cut
                    continue
                with pytest.raises(jl.RecordError, match=r"s\.tar: byte \d+|s\.tar: the "
                                                         r"member after record \d+: cannot"):
                    read_all(shard)


def _samples(path, n, size=1000):
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            for ext, data in (("bin", bytes([i % 251]) * size), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"sample{i:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _header_offset(whole, name):
    return whole.index(name.encode())


def _loader_reads(paths, workers, **kwargs):
    with jl.StreamLoader(jl.Stream.tar(paths, **kwargs), batch_size=10,
                         num_workers=workers, process_index=0,
                         process_count=1) as loader:
        it = iter(loader)
        return [next(it) for _ in range(100)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_cut_inside_a_member_is_an_error_naming_it(tmp_path, workers):
    path = _samples(tmp_path / "cut.tar", 500)
    whole = path.read_bytes()
    at = _header_offset(whole, "sample00180.bin")
    path.write_bytes(whole[:at + 512 + 188])  # 188 of sample 180's 1,000 bytes
    paths = [path, _samples(tmp_path / "whole.tar", 500)]  # 2 shards: one per reader
    with pytest.raises(Exception, match=rf"cut.tar: byte {at}: member 'sample00180.bin' "
                                        r"is cut short: its header says "
                                        r"1,000 bytes .* the file holds 188 more"):
        _loader_reads(paths if workers else path, workers)


def test_a_shard_rewritten_while_read_is_said_so_not_called_damaged(tmp_path):
    # written again in place (shorter, other members): the next header read was blamed on
    # damage ("fails its checksum", "cut short": replace the shard), the rewrite not named
    path = _samples(tmp_path / "a.tar", 40)
    for rewrite in ("other", "cut"):
        shard = jl.Stream.tar(str(path)).shards[0]
        shard.reset(None)
        assert shard.next()["__key__"] == "sample00000"
        whole = path.read_bytes()
        with open(path, "r+b") as f:  # (in place: the reader's open file sees it)
            if rewrite == "other":
                f.truncate(0)
                f.write(_samples(tmp_path / "b.tar", 40, size=100).read_bytes())
            else:
                f.truncate(_header_offset(whole, "sample00002.bin") + 600)
        with pytest.raises(jl.RecordError, match=r"a.tar: the file was modified while read "
                                                 r"\(by record \d+; 112,640 bytes when opened"):
            for _ in range(40):
                shard.next()
        shard.close()
        path.write_bytes(whole)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_size_field_past_the_end_of_the_file_is_an_error_not_one_huge_record(tmp_path,
                                                                                workers):
    path = _samples(tmp_path / "big.tar", 200)
    whole = bytearray(path.read_bytes())
    at = _header_offset(whole, "sample00100.bin")
    header = whole[at:at + 512]
    header[124:136] = b"77777777777\0"  # ~8 GiB, with a checksum that fits it
    header[148:156] = b"        "
    header[148:156] = b"%06o\0 " % sum(header)
    whole[at:at + 512] = header
    path.write_bytes(bytes(whole))
    paths = [path, _samples(tmp_path / "other.tar", 200)]
    with pytest.raises(Exception, match=rf"big.tar: byte {at}: member 'sample00100.bin' "
                                        r"is cut short: its header says "
                                        r"8,589,934,591 bytes"):
        _loader_reads(paths if workers else path, workers)


@pytest.mark.parametrize("link", [tarfile.LNKTYPE, tarfile.SYMTYPE])
def test_a_member_stored_as_a_link_is_an_error_not_a_sample_lost(tmp_path, link):
    # tar stores a file linked twice (a sample's files hard-linked to another's) as a link to
    # the first: its sample came out without that member, or not at all, without a word
    path = tmp_path / "links.tar"
    with tarfile.open(path, "w") as tar:
        for key in ("a", "b"):
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = 3
            tar.addfile(info, io.BytesIO(key.encode() * 3))
        info = tarfile.TarInfo("c.txt")
        info.type, info.linkname = link, "a.txt"
        tar.addfile(info)
        info = tarfile.TarInfo("d.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"ddd"))
    kind = "hard" if link == tarfile.LNKTYPE else "symbolic"
    with pytest.raises(jl.RecordError, match=rf"links.tar: byte 2048: member 'c.txt' is a {kind} "
                                             r"link to 'a.txt', which holds no data of its own; "
                                             r"re-create the shard .*GNU tar --"):
        read_all(jl.TarShard(path))


def test_a_damaged_header_fails_its_checksum_by_name(tmp_path):
    path = _samples(tmp_path / "flip.tar", 20)
    whole = bytearray(path.read_bytes())
    at = _header_offset(whole, "sample00007.cls")
    whole[at + 3] ^= 0x01  # one bit of the name
    path.write_bytes(bytes(whole))
    with pytest.raises(jl.RecordError, match=rf"flip.tar: byte {at}: the header of member "
                                             r"'sam.le00007.cls' fails its checksum "
                                             r"\(stored \d+, computed \d+\)"):
        read_all(jl.TarShard(path))


@pytest.mark.parametrize("size", [b"-0000000001\0", b"-0000001000\0"])
def test_a_negative_size_field_is_refused_not_an_empty_member(tmp_path, size):
    # int(field, 8) takes a sign: -1 to -511 padded to nothing, an empty member read silently
    path = _samples(tmp_path / "neg.tar", 3)
    whole = bytearray(path.read_bytes())
    at = _header_offset(whole, "sample00001.cls")
    whole[at + 124:at + 136] = size
    whole[at + 148:at + 156] = b"        "  # the checksum made right for the new field
    whole[at + 148:at + 155] = f"{sum(whole[at:at + 512]):06o}\0".encode()
    path.write_bytes(bytes(whole))
    assert tarfile.TarInfo.frombuf(bytes(whole[at:at + 512]), "utf-8", "strict").size < 0
    with pytest.raises(jl.RecordError, match=rf"neg.tar: byte {at}: not a tar header "
                                             r"\(size field b'-0"):
        read_all(jl.TarShard(path))


def test_a_member_too_large_for_memory_is_said_so_not_a_damaged_file(tmp_path):
    # a MemoryError (a member of gigabytes, or a decompression bomb) asked "is the file
    # whole?", which sent the user to the wrong remedy
    path = _samples(tmp_path / "big.tar", 2, size=10_000)
    shard = jl.TarShard(path)
    shard.reset()

    class Short:  # a file whose reads of a large member run out of memory
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            if n > _SMALL:
                raise MemoryError
            return self.f.read(n)

        def __getattr__(self, name):
            return getattr(self.f, name)

    shard._file = Short(shard._file)  # (the first member was read by reset())
    with pytest.raises(jl.RecordError, match=r"big.tar: the member after record \d+: does not "
                                             r"fit in this process's memory \(MemoryError"):
        for _ in range(4):
            shard.next()


def test_a_long_name_or_attributes_member_of_megabytes_is_refused_and_others_not_kept(tmp_path):
    # a GNU long name claiming 3 GiB (14 MB gzipped) was read whole, then refused as "a
    # record" too large for memory, or an OOM kill (the hostile-input audit); a directory's
    # data, which makes no record, was read whole too
    path = tmp_path / "names.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        folder = tarfile.TarInfo("d")
        folder.type, folder.size = tarfile.DIRTYPE, 3 * 2**20
        tar.addfile(folder, io.BytesIO(b"z" * folder.size))
        for name in ("a" * 300 + ".txt", "b.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    assert [r["__key__"][-1] for r in read_all(jl.TarShard(path))] == ["a", "b"]
    raw = bytearray(path.read_bytes())
    gnu = raw.index(b"././@LongLink")
    raw[gnu + 124:gnu + 136] = b"%011o\0" % (2 * 2**20)  # (its size field, its checksum:)
    raw[gnu + 148:gnu + 156] = b" " * 8
    raw[gnu + 148:gnu + 155] = b"%06o\0" % sum(raw[gnu:gnu + 512])
    path.write_bytes(bytes(raw) + b"\0" * (2 * 2**20))
    with pytest.raises(jl.RecordError, match=r"names.tar: byte \d+: member '././@LongLink' "
                                             r"holds a GNU long name of 2,097,152 bytes"):
        read_all(jl.TarShard(path))


def test_a_shard_ending_inside_a_header_or_without_its_end_marker(tmp_path):
    path = _samples(tmp_path / "end.tar", 10)
    whole = path.read_bytes()
    at = _header_offset(whole, "sample00004.bin")
    path.write_bytes(whole[:at + 300])
    with pytest.raises(jl.RecordError, match=rf"end.tar: byte {at}: it ends "
                                             r"inside a header \(300 of 512 bytes\)"):
        read_all(jl.TarShard(path))
    path.write_bytes(whole[:at])
    with pytest.raises(jl.RecordError, match=r"ends without the end-of-archive marker .* "
                                             r"tolerate_missing_end=True"):
        read_all(jl.TarShard(path))
    assert len(read_all(jl.TarShard(path, tolerate_missing_end=True))) == 4
    path.write_bytes(b"")  # (a download that failed: no record, not even with the tolerance)
    for tolerate in (False, True):
        with pytest.raises(jl.RecordError, match=r"end.tar: byte 0: the file holds no bytes "
                                                 r"\(decompressed, where it is compressed; an "
                                                 r"empty archive holds its end marker, 1,024\); "
                                                 r"replace the shard"):
            read_all(jl.TarShard(path, tolerate_missing_end=tolerate))
    gz = tmp_path / "end.tar.gz"
    gz.write_bytes(gzip.compress(b""))  # (a compressed file of no bytes: the same)
    with pytest.raises(jl.RecordError, match=r"end.tar.gz: byte 0: the file holds no bytes "
                                             r"\(decompressed, where it is compressed"):
        read_all(jl.TarShard(gz, tolerate_missing_end=True))
    path.write_bytes(bytes(1024))  # (an empty archive: none, said by no error)
    assert read_all(jl.TarShard(path)) == []


def test_a_state_at_the_end_of_a_shard_resumes_at_its_end(tmp_path):
    path = _samples(tmp_path / "a.tar", 3)
    shard = jl.TarShard(path)
    assert len(read_all(shard)) == 3
    state = shard.get_state()
    assert read_all(jl.TarShard(path), state) == []


@pytest.mark.parametrize("gzipped", [False, True])
def test_archives_joined_end_to_end_are_refused_not_read_as_the_first_alone(tmp_path, gzipped):
    # cat a.tar b.tar (or a.tar.gz b.tar.gz): tar and tarfile stop at a.tar's end-of-archive
    # marker, and b.tar's members were never read, without a word
    first = _samples(tmp_path / "a.tar", 3).read_bytes()
    second = _samples(tmp_path / "b.tar", 2).read_bytes()
    path = tmp_path / ("ab.tar.gz" if gzipped else "ab.tar")
    path.write_bytes(gzip.compress(first) + gzip.compress(second) if gzipped
                     else first + second)
    assert len(_tarfile_records(path)) == 3  # (what tar reads of it: the first archive only)
    with pytest.raises(jl.RecordError, match=r"ab.tar(.gz)?: byte \d+: the end-of-archive "
                                             r"marker \(two zero blocks\) is followed by a tar "
                                             r"header \(member 'sample00000.bin'\) at byte "
                                             rf"{len(first):,}: another archive joined after "
                                             r"this one \(cat a.tar b.tar\).*--concatenate"):
        read_all(jl.TarShard(path))


def test_data_after_the_end_of_archive_marker_is_warned_of_and_zeros_are_read(tmp_path):
    # not a tar header (a signature some tools append): the records are all there, said once
    first = _samples(tmp_path / "a.tar", 3).read_bytes()
    path = tmp_path / "signed.tar"
    path.write_bytes(first + b"signed by me")
    with pytest.warns(jl.JaxloaderWarning, match=rf"signed.tar: byte {len(first):,}: data that "
                                                 r"is not a tar member follows the end-of-archive "
                                                 r"marker .*cut the file to its archive"):
        assert len(read_all(jl.TarShard(path))) == 3
    path = tmp_path / "later.tar"
    path.write_bytes(first + bytes(3 * 512 + 70000) + b"x")  # (zeros, then data)
    with pytest.warns(jl.JaxloaderWarning, match=rf"later.tar: byte {len(first) + 71536:,}: "):
        assert len(read_all(jl.TarShard(path))) == 3
    with warnings.catch_warnings():  # (said once a file)
        warnings.simplefilter("error")
        assert len(read_all(jl.TarShard(path))) == 3
        path = tmp_path / "strict.tar"  # (a warning made an error is raised as it is, and
        path.write_bytes(first + b"signed")  # said again: not "its compressed stream")
        for _ in range(2):
            with pytest.raises(jl.JaxloaderWarning, match="data that is not a tar member"):
                read_all(jl.TarShard(path))
    second = _samples(tmp_path / "b.tar", 2).read_bytes()
    path = tmp_path / "junk_then_b.tar"  # (a block of data, then a joined archive: refused)
    path.write_bytes(first + b"x" * 512 + second)
    with pytest.raises(jl.RecordError, match=rf"a tar header \(member 'sample00000.bin'\) at "
                                             rf"byte {len(first) + 512:,}: another archive"):
        read_all(jl.TarShard(path))
        path = tmp_path / "zeros.tar"
        path.write_bytes(first + bytes(100000))  # zeros past the record size: nothing said
        assert len(read_all(jl.TarShard(path))) == 3


def test_members_not_named_key_ext_are_left_out_and_said_once_a_folder(tmp_path):
    # macOS's tar adds ._name resource files, and a member without an extension made a
    # record {'__key__': 'noext', '': ...}: records of key '' or extension '' that failed far
    # from the shard (WebDataset leaves such members out)
    path = tmp_path / "mac.tar"
    with tarfile.open(path, "w") as tar:
        for name in ("._000.jpg", "000.jpg", "000.txt", "noext", "d/.hidden.txt", "001.jpg"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    with pytest.warns(UserWarning, match=r"mac.tar: byte 0: member '._000.jpg' is left out, "
                                         r"as any other of this shard .*COPYFILE_DISABLE=1") as got:
        records = read_all(jl.TarShard(path))
    assert len([w for w in got if "left out" in str(w.message)]) == 1
    assert [sorted(r) for r in records] == [["__key__", "jpg", "txt"], ["__key__", "jpg"]]
    assert [r["__key__"] for r in records] == ["000", "001"]
    shard = jl.TarShard(path)  # a state after the first record resumes past the left-out
    shard.reset()
    shard.next()
    assert read_all(jl.TarShard(path), shard.get_state()) == records[1:]
    shard.close()
    for i in range(3):  # (said once a folder: a thousand shards tarred on a Mac said it a
        (tmp_path / f"mac{i}.tar").write_bytes(path.read_bytes())  # thousand times a pass)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        for i in range(3):
            read_all(jl.TarShard(tmp_path / f"mac{i}.tar"))
    assert not [w for w in again if "left out" in str(w.message)]


def test_a_cut_shards_remedy_resumes_over_the_whole_copy(tmp_path):
    # the error sent the user to drop the shard (then every state was refused) or replace it,
    # where a state saved inside the cut copy was refused as 'appended to' with the remedy
    # Stream.jsonl: Stream.tar(append_only=True) resumes over the whole copy
    path = _samples(tmp_path / "cut.tar", 6)
    whole = path.read_bytes()
    path.write_bytes(whole[:_header_offset(whole, "sample00004.bin")])
    shard = jl.TarShard(path)
    shard.reset()
    for _ in range(2):
        shard.next()
    state = shard.get_state()
    with pytest.raises(jl.RecordError, match=r"a state saved inside the cut copy resumes over "
                                             r"the whole one read with Stream.tar\(paths, "
                                             r"append_only=True\)\), or drop it from the stream "
                                             r"\(a state saved while it was in the stream is "
                                             r"then refused\)"):
        read_all(shard, state)
    path.write_bytes(whole)
    with pytest.raises(jl.StateDictError, match=r"appended to it, or it was cut short when the "
                                                r"state was saved .*Stream.tar\(paths, "
                                                r"append_only=True\)"):
        read_all(jl.TarShard(path), state)
    rest = read_all(jl.TarShard(path, append_only=True), state)
    assert [r["__key__"] for r in rest] == [f"sample{i:05d}" for i in range(2, 6)]


def _tar_of(path, names):
    """A tar of one-member records named ``names`` (10 bytes each), padded as tarfile pads."""
    with tarfile.open(path, "w") as tar:
        for name in names:
            data = name.encode().ljust(10, b".")
            info = tarfile.TarInfo(f"{name}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("append_only", [False])  # (True takes a file that kept its first
# bytes and its size or more: a tar appended to in place keeps its size)
def test_a_tar_edited_or_with_a_record_put_in_at_the_same_size_is_refused(tmp_path,
                                                                          append_only):
    # a tar's last KiB is its closing zeros and padding, the same in every tar: its identity
    # was its size and first KiB, and an edit of its last records, or a record put in the
    # middle (the padding's room kept the size), restored over them without a word (the
    # determinism audit)
    path = tmp_path / "s.tar"
    names = [f"r{i:03d}" for i in range(40)]
    _tar_of(path, names)
    size = path.stat().st_size
    shard = jl.TarShard(path, append_only=append_only)
    shard.reset()
    for _ in range(5):
        shard.next()
    state = shard.get_state()
    shard.close()
    for changed in ([*names[:-1], "BAD"], [*names[:3], "new", *names[3:]]):
        _tar_of(path, changed)
        assert path.stat().st_size == size  # (the same size)
        with pytest.raises(jl.StateDictError, match=r"the same size; its last KiB of records "
                                                    r"\(before the tar's closing zeros\), or "
                                                    r"where they end, differs"):
            read_all(jl.TarShard(path, append_only=append_only), state)
    _tar_of(path, names)  # (as it was: resumed)
    assert [r["__key__"] for r in read_all(jl.TarShard(path), state)] == names[5:]
    older = {**state, "tail": zlib.crc32(path.read_bytes()[-1024:])}  # (saved before: zeros)
    assert older["tail"] != state["tail"]
    assert [r["__key__"] for r in read_all(jl.TarShard(path), older)] == names[5:]


@pytest.mark.parametrize("append_only", [False, True])
def test_a_tar_appended_to_in_place_while_read_is_refused_as_such(tmp_path, append_only):
    # append_only took its growth for lines appended: "another archive joined after this one",
    # or nothing, by the reads' buffering; without it the remedy was append_only=True (the
    # streams audit)
    path = str(tmp_path / "s.tar")

    def add(mode, names):
        with tarfile.open(path, mode) as tar:
            for name in names:
                info = tarfile.TarInfo(f"{name}.txt")
                info.size = len(name)
                tar.addfile(info, io.BytesIO(name.encode()))
    add("w", [f"k{i}" for i in range(6)])
    with jl.StreamLoader(jl.Stream.tar(path, append_only=append_only), batch_size=1,
                         process_index=0, process_count=1) as loader:
        it = iter(loader)
        for _ in range(4):
            next(it)
        add("a", [f"m{i}" for i in range(3)])
        with pytest.raises(jl.RecordError, match="the file was modified while read.*add whole tar "
                                                 "files to the stream"):
            for _ in range(10):
                next(it)
