from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxloader.runtime.shm import MEMFD_AVAILABLE, PREFIX, Segment, attach

needs_memfd = pytest.mark.skipif(not MEMFD_AVAILABLE, reason="memory files are Linux-only")


def test_posix_names_carry_prefix_and_owner_pid_and_unlink_removes_them():
    seg = Segment.create(10_000, memfd=False)
    assert seg.name.startswith(f"{PREFIX}_{os.getpid()}_") and seg.size % 4096 == 0
    assert os.path.exists(f"/dev/shm/{seg.name}")
    other = attach(seg.name, seg.size)
    other[5] = 42
    assert seg.buf[5] == 42  # one memory, two mappings
    other.close()
    assert seg.destroy()
    assert not os.path.exists(f"/dev/shm/{seg.name}")
    seg.destroy()  # idempotent


def test_a_dev_shm_read_only_or_missing_is_named_with_the_remedy(monkeypatch):
    # a bare "OSError: [Errno 30] Read-only file system: '/jaxloader_..._...'"
    import errno

    from jaxloader.base.errors import SharedMemoryError
    from jaxloader.runtime import shm

    for code in (errno.EROFS, errno.ENOENT, errno.ENOSPC):  # (ENOSPC: out of inodes, bare too;
        def refused(*_, code=code, **__):  # the containers audit)
            raise OSError(code, os.strerror(code), "/jaxloader_1_ab")
        monkeypatch.setattr(shm._posixshmem, "shm_open", refused)
        said = r"inodes are used up: df -i" if code == errno.ENOSPC else "writable tmpfs"
        with pytest.raises(SharedMemoryError, match=rf"in /dev/shm \(.*\): .*{said}"
                                                    r".*--shm-size.*num_workers=0"):
            Segment.create(10_000, memfd=False)


def test_memory_files_refused_by_the_kernel_or_a_sandbox_leave_the_loader_on_dev_shm(
        tmp_path):
    # an old kernel under a newer C library (ENOSYS), a seccomp profile (EPERM): the loader
    # failed as it was made with a bare OSError, where /dev/shm would do (containers audit)
    script = tmp_path / "refused.py"
    script.write_text(textwrap.dedent("""
        import errno, os, sys
        def refused(*args, **kwargs):
            raise OSError(int(sys.argv[1]), "refused")
        os.memfd_create = refused
        import numpy as np, jaxloader as jl
        from jaxloader.runtime import shm
        source = jl.ArraySource({"x": np.arange(64)})
        with jl.DataLoader(source, batch_size=8, shuffle=False, num_workers=1,
                           process_index=0, process_count=1) as loader:
            print(sum(int(b["x"].sum()) for b in loader))
        assert not shm.MEMFD_AVAILABLE and shm.PROC_FDS
    """))
    for code in (errno.ENOSYS, errno.EPERM):
        done = subprocess.run([sys.executable, str(script), str(code)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.split() == [str(sum(range(64)))], \
            done.stderr[-2000:]


def test_the_portable_paths_make_segments_and_say_what_refuses_them(monkeypatch):
    # (the portable-paths audit) macOS's os has no posix_fallocate: every loader with workers
    # failed as it was made, naming it; a file system that reserves nothing ahead raised a
    # bare EOPNOTSUPP; a read-only /dev/shm refused the cleanup's unlink too, and its bare
    # "Read-only file system" came out instead of the remedy
    import errno

    from jaxloader.base.errors import SharedMemoryError
    from jaxloader.runtime import shm

    monkeypatch.delattr(os, "posix_fallocate")
    for memfd in (False, shm.MEMFD_AVAILABLE):
        seg = Segment.create(10_000, memfd=memfd)
        seg.buf[9_999] = 7
        assert seg.buf[9_999] == 7 and seg.destroy()
    monkeypatch.undo()

    def unsupported(fd, offset, size):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    seg = Segment.create(10_000, memfd=False)
    assert seg.size >= 10_000 and seg.destroy()
    monkeypatch.undo()

    def read_only(*_, **__):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), "/jaxloader_1_ab")

    monkeypatch.setattr(shm._posixshmem, "shm_open", read_only)  # (a read-only mount refuses
    monkeypatch.setattr(shm._posixshmem, "shm_unlink", read_only)  # the unlink too)
    with pytest.raises(SharedMemoryError, match=r"in /dev/shm \(.*\): .*writable tmpfs"):
        Segment.create(10_000, memfd=False)


@needs_memfd
def test_memory_files_leave_nothing_in_dev_shm_and_close_their_descriptor():
    before = set(os.listdir("/dev/shm"))
    seg = Segment.create(10_000)
    kind, pid, fd, inode = seg.name.split(":")
    assert kind == "memfd" and int(pid) == os.getpid()
    assert os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{PREFIX}_")
    assert set(os.listdir("/dev/shm")) == before
    other = attach(seg.name, seg.size)
    other[5] = 42
    assert seg.buf[5] == 42
    other.close()
    assert seg.destroy()
    assert not os.path.exists(f"/proc/self/fd/{fd}") or not os.readlink(
        f"/proc/self/fd/{fd}").startswith("/memfd:")


@needs_memfd
def test_a_segment_holds_one_descriptor_where_python_can_map_without_one():
    def descriptors():
        return len(os.listdir("/proc/self/fd"))
    before = descriptors()
    segments = [Segment.create(4096) for _ in range(20)]
    owned = descriptors() - before
    views = [attach(seg.name, seg.size) for seg in segments]  # (a worker's)
    mapped = descriptors() - before - owned
    for view, seg in zip(views, segments):
        view.close()
        seg.destroy()
    untracked = sys.version_info >= (3, 13)
    assert (owned, mapped) == ((20, 0) if untracked else (20, 20))


@needs_memfd
def test_a_kept_slot_unlinked_holds_no_descriptor_and_is_unmapped_with_its_last_view():
    # before Python 3.13 mmap kept a duplicate descriptor for the mapping's life: a batch kept
    # (unlinked, its views alive) still held one, and list(loader) filled a limit of 1,024
    # after 857 batches on Python 3.11 (the workers audit)
    def descriptors():
        return len(os.listdir("/proc/self/fd"))

    def mapped(segment):
        token = segment.name  # memfd:<pid>:<fd>:<inode>: the mapping's inode in /proc's maps
        with open("/proc/self/maps") as maps:
            return any(f" {token.rsplit(':', 1)[1]} " in line and "/memfd:" in line
                       for line in maps)

    before = descriptors()
    segment = Segment.create(1 << 16)
    view = np.frombuffer(segment.memory, np.uint8)
    view[:] = 7
    assert descriptors() == before + 1 and mapped(segment)
    segment.unlink()
    assert not segment.close()  # (a view reads it: unmapped with the view)
    assert descriptors() == before and mapped(segment) and view.sum() == 7 << 16
    del view
    assert not mapped(segment)


@needs_memfd
def test_a_full_descriptor_table_is_a_shared_memory_error_with_the_remedy(monkeypatch):
    import errno

    from jaxloader.base.errors import SharedMemoryError
    from jaxloader.runtime import shm

    def full(*args):
        raise OSError(errno.EMFILE, "Too many open files")
    monkeypatch.setattr(shm.os, "memfd_create", full)
    monkeypatch.setattr(shm.os, "listdir", full)  # (as the table is full: /proc/self/fd too)
    with pytest.raises(SharedMemoryError, match=r"no descriptor left for a new segment \(Too "
                                                r"many open files; this process may hold .*: "
                                                r"raise the limit .*ulimit -n.*close the "
                                                r"loaders you no longer use"):
        Segment.create(4096)


@pytest.mark.parametrize("memfd", [pytest.param(True, marks=needs_memfd), False])
def test_an_address_space_limit_is_a_shared_memory_error_with_the_remedy(memfd):
    # ulimit -v (HPC schedulers set it): a bare "OSError: [Errno 12] Cannot allocate memory"
    script = f"""
import resource
from jaxloader.base.errors import SharedMemoryError
from jaxloader.runtime.shm import Segment
size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (32 << 20), resource.RLIM_INFINITY))
try:
    Segment.create(64 << 20, prefault=False, memfd={memfd})
except SharedMemoryError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert "could not map 67,108,864 bytes (Cannot allocate memory): this process's address " \
           "space is limited to" in out.stdout, out.stderr
    assert "ulimit -v" in out.stdout


@needs_memfd
def test_a_reused_descriptor_number_is_never_mapped_as_the_old_segment():
    seg = Segment.create(4096)
    _, pid, fd, inode = seg.name.split(":")
    seg.destroy()
    other = Segment.create(4096)  # likely takes the same descriptor number
    stale = f"memfd:{pid}:{other.name.split(':')[2]}:{inode}"
    with pytest.raises(Exception, match="another file|No such file"):
        attach(stale, 4096)
    other.destroy()


@pytest.mark.parametrize("memfd", [pytest.param(True, marks=needs_memfd), False])
def test_close_with_live_views_never_raises_and_the_views_stay_valid(memfd):
    seg = Segment.create(4096, memfd=memfd)
    view = np.frombuffer(seg.buf, np.uint8)
    view[:3] = [1, 2, 3]
    assert seg.destroy() is False  # still read by the view: unmapped when the view dies
    assert not os.path.exists(f"/dev/shm/{seg.name}")
    assert view[:3].tolist() == [1, 2, 3]
    del view


def _in_small_dev_shm(case: str) -> str:
    """BatchRuns small_shm_run.py CASE in a mount namespace whose /dev/shm is a 64 MB tmpfs."""
    if os.geteuid() != 0:
        pytest.skip("a 64 MB /dev/shm of its own needs root (unshare -m, mount)")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "small_shm_run.py")
    proc = subprocess.run(["unshare", "-m", "sh", "-c",
                           'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" "$@"',
                           sys.executable, script, case],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


@needs_memfd
@pytest.mark.parametrize("case", ["source", "batches"])
def test_a_64_mb_dev_shm_limits_nothing(case):
    out = _in_small_dev_shm(case)
    assert f"ok {case} left in /dev/shm: []" in out


def test_memory_that_cannot_be_reserved_is_refused_at_construction_not_a_sigbus():
    # POSIX shared memory in a full /dev/shm: the limit a test can set (a memory-limited
    # cgroup would OOM-kill instead, for memory files and any other allocation alike)
    out = _in_small_dev_shm("posix")
    assert "refused: the source's array 1 (" in out and "shared memory: could not reserve" \
        in out and "in /dev/shm" in out and "np.load(path, mmap_mode='r')" in out
    assert "bytes were free in /dev/shm" in out and "--shm-size" in out
    assert "ok posix left in /dev/shm: []" in out


def test_a_file_size_limit_is_named_not_blamed_on_the_sources_pickling():
    # a scheduler's ulimit -f (memory files count against it) said "cannot send the source
    # ArraySource(...): OSError File too large; make it picklable" (the disk-full audit)
    code = """if True:
        import resource, numpy as np, jaxloader as jl
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.getrlimit(
            resource.RLIMIT_FSIZE)[1]))
        try:
            jl.DataLoader(jl.ArraySource({"x": np.zeros((4096, 64), np.float32)}),
                          batch_size=8, num_workers=2, process_index=0, process_count=1)
        except jl.SharedMemoryError as e:
            print(e)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert "could not reserve 1,048,576 bytes" in done.stdout, done.stderr[-2000:]
    assert "the file-size limit is 65,536 bytes (ulimit -f" in done.stdout


def test_a_ctrl_c_in_a_segments_prefault_leaves_no_memory_file_open(monkeypatch):
    # the prefault ran after the memory file was made, outside its failure path: each
    # interrupted create left a memory file open for the process's life
    from jaxloader.runtime import shm as shm_module

    def files():
        return {f for f in os.listdir("/proc/self/fd")
                if "jaxloader" in (os.readlink(f"/proc/self/fd/{f}")
                                   if os.path.exists(f"/proc/self/fd/{f}") else "")}

    before = files()

    class Interrupted:
        def __getattr__(self, name):
            return getattr(np, name)

        def frombuffer(self, *args, **kwargs):
            raise KeyboardInterrupt

    monkeypatch.setattr(shm_module, "np", Interrupted())
    registry: dict = {}
    for _ in range(3):
        with pytest.raises(KeyboardInterrupt):
            shm_module.Segment.create(4096, registry=registry)
    monkeypatch.undo()
    assert files() - before == set() and registry == {}


def test_memory_files_are_looked_for_when_first_wanted_not_as_jaxloader_is_imported(tmp_path):
    # a seccomp profile that kills a process making one (systemd's SystemCallFilter) ended
    # `import jaxloader` once a probe made one at import, where a loader without workers never
    # makes one (the review)
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent("""
        import os
        os.memfd_create = lambda *args, **kwargs: os._exit(99)  # (the kill, as a seccomp's)
        import numpy as np, jaxloader as jl
        from jaxloader.runtime import shm
        assert "MEMFD_AVAILABLE" not in vars(shm)
        with jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=8, shuffle=False,
                           num_workers=0, process_index=0, process_count=1) as loader:
            print(sum(int(b["x"].sum()) for b in loader))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.split() == [str(sum(range(64)))], \
        (done.returncode, done.stderr[-2000:])
