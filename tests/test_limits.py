"""The CPUs and memory a container's cgroup allows (``runtime.limits``), read from files laid
out as the kernel's cgroup v1 and v2 lay them out."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxloader.runtime import limits


@pytest.fixture
def files(monkeypatch):
    """``limits``'s cgroup files, and this process's cgroups, as a test lays them out."""
    laid: dict[str, str] = {}
    monkeypatch.setattr(limits, "_read", lambda path: laid.get(path))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    return laid


def test_a_pods_cpu_quota_bounds_the_cores_below_its_affinity(files, monkeypatch):
    # a pod limited to 4 CPUs on a 64-core node: its affinity lists 64, and the advice said
    # to run 64 workers for a 64x speed-up, "auto" could grow to 64 (the CPU-quota audit)
    monkeypatch.setattr(limits, "_cgroups", lambda: [("", "/kubepods/pod1/c1")])
    assert limits.cores() == 64  # (no limit anywhere: "max")
    files["/sys/fs/cgroup/kubepods/pod1/c1/cpu.max"] = "max 100000"
    files["/sys/fs/cgroup/kubepods/pod1/cpu.max"] = "400000 100000"  # (the pod's, above)
    assert limits.cores() == 4
    from jaxloader.loaders.diagnosis import cores_available
    from jaxloader.loaders.monitor import AutoTune
    assert cores_available() == 4 and AutoTune(None).cores == 4
    files["/sys/fs/cgroup/kubepods/pod1/c1/cpu.max"] = "250000 100000"  # (2.5: 3 busy)
    assert limits.cores() == 3
    monkeypatch.setattr(limits, "_cgroups", lambda: [("cpu,cpuacct", "/docker/abc")])
    files["/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us"] = "200000"
    files["/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us"] = "100000"
    assert limits.cores() == 2  # (v1, docker run --cpus=2)
    files["/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us"] = "-1"
    assert limits.cores() == 64
    # RHEL 7's kernel lists the controllers "cpuacct,cpu"; the folder is "cpu,cpuacct", and
    # the links "cpu" and "cpuacct" name it: the quota was never read (the 25th review)
    monkeypatch.setattr(limits, "_cgroups", lambda: [("cpuacct,cpu", "/docker/abc")])
    files["/sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us"] = "400000"
    files["/sys/fs/cgroup/cpu/docker/abc/cpu.cfs_period_us"] = "100000"
    assert limits.cores() == 4


def test_a_pods_memory_limit_bounds_the_memory_available(files, monkeypatch):
    # "auto"'s memory bound read the node's MemAvailable: a pod's 16 GiB was no bound
    monkeypatch.setattr(limits, "_meminfo_available", lambda: 1 << 40)
    monkeypatch.setattr(limits, "_cgroups", lambda: [("", "/kubepods/pod1")])
    assert limits.available_bytes() == 1 << 40
    files["/sys/fs/cgroup/kubepods/pod1/memory.max"] = str(16 << 30)
    files["/sys/fs/cgroup/kubepods/pod1/memory.current"] = str(6 << 30)
    assert limits.available_bytes() == 10 << 30
    from jaxloader.loaders.monitor import _available_bytes
    assert _available_bytes() == 10 << 30
    from jaxloader.runtime.shm import _free  # (an out-of-memory error quoted the node's)
    assert _free("memfd") == f"{10 << 30:,} bytes of memory were available"
    files["/sys/fs/cgroup/kubepods/pod1/memory.stat"] = f"anon 1\ninactive_file {4 << 30}\n"
    assert limits.available_bytes() == 14 << 30  # (the file cache the kernel takes back: a
    files["/sys/fs/cgroup/kubepods/pod1/memory.max"] = "max"  # loader's reads fill it)
    assert limits.available_bytes() == 1 << 40
    monkeypatch.undo()
    monkeypatch.setattr(limits, "_meminfo_available", lambda: 1 << 40)
    monkeypatch.setattr(limits, "open", lambda *a, **k: (_ for _ in ()).throw(  # (a cgroup
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")), raising=False)
    assert limits.cores() >= 1 and limits.available_bytes() == 1 << 40  # named \xff)


def test_shared_memory_past_what_the_cgroup_leaves_is_refused_not_left_to_the_kernel(
        files, monkeypatch):
    """Under a container's memory limit a reservation never fails: the kernel's out-of-memory
    killer ends the training process, without a word (the workers audit: a 500 MB slot under
    a 300 MiB limit). Memory the cgroup's limit leaves (its whole file cache free, free swap
    added) bounds a reservation, which past it is refused."""
    import jaxloader as jl
    from jaxloader.runtime import shm

    monkeypatch.setattr(limits, "_meminfo", lambda key: {"MemAvailable:": 1 << 40,
                                                          "SwapFree:": 0}[key])
    monkeypatch.setattr(limits, "_cgroups", lambda: [("", "/kubepods/pod1")])
    files["/sys/fs/cgroup/kubepods/pod1/memory.max"] = str(16 << 30)
    files["/sys/fs/cgroup/kubepods/pod1/memory.current"] = str(10 << 30)
    files["/sys/fs/cgroup/kubepods/pod1/memory.stat"] = (  # (file: shmem too, the loader's
        f"inactive_file {1 << 30}\nactive_file {1 << 30}\nfile {5 << 30}\nshmem {3 << 30}\n")
    assert limits.available_bytes() == 7 << 30 and limits.reservable_bytes() == 8 << 30
    monkeypatch.setattr(limits, "_meminfo", lambda key: {"MemAvailable:": 1 << 40,
                                                          "SwapFree:": 1 << 30}[key])
    assert limits.reservable_bytes() == 9 << 30  # (shared pages may go to swap)
    monkeypatch.setattr(limits, "reservable_bytes", lambda: 1 << 20)
    with pytest.raises(jl.SharedMemoryError, match=r"could not reserve 2,097,152 bytes .* "
                       r"1,048,576 bytes of memory are left"):
        shm.Segment.create(2 << 20)
    shm.Segment.create(1 << 19).destroy()


def test_a_containers_process_limit_is_named_beside_ulimit(files, monkeypatch):
    """Under a pids cgroup limit (docker run --pids-limit) a worker that could not start was
    told of ulimit -u's 96,364, nowhere near, and not of the limit reached (the workers audit)."""
    monkeypatch.setattr(limits, "_cgroups", lambda: [("pids", "/docker/abc")])
    assert limits.process_limits().startswith("ulimit -u ")
    files["/sys/fs/cgroup/pids/docker/abc/pids.max"] = "11"
    files["/sys/fs/cgroup/pids/docker/abc/pids.current"] = "11"
    assert limits.process_limits().endswith(
        "; a cgroup's pids.max 11, 11 in use (a container's --pids-limit)")
    monkeypatch.setattr(limits, "_cgroups", lambda: [("", "/kubepods/pod1")])  # (v2, a pod)
    files["/sys/fs/cgroup/kubepods/pod1/pids.max"] = "64"
    files["/sys/fs/cgroup/kubepods/pod1/pids.current"] = "12"
    assert "pids.max 64, 12 in use" in limits.process_limits()


def test_autotunes_memory_bound_is_half_of_what_the_workers_may_have(monkeypatch, caplog):
    # half of what was free each window, measured after the workers took some, let them grow
    # to ~90% of the memory (13 workers of 100 MB in 2,000 MB; the autotune audit): the free
    # memory and the workers' own, halved
    import logging

    from jaxloader.loaders import monitor

    free, each = 2000 << 20, 100 << 20

    class Pool:
        pids: list = [1]
    tune = monitor.AutoTune(Pool(), cores=64)
    monkeypatch.setattr(monitor, "_resident_bytes", lambda pid: each)
    monkeypatch.setattr(monitor, "_available_bytes", lambda: free - len(Pool.pids) * each)
    with caplog.at_level(logging.INFO, logger="jaxloader"):
        for _ in range(12):  # grow to the bound, as autotune does window after window
            Pool.pids = list(range(min(tune._memory_bound(len(Pool.pids)), 2 * len(Pool.pids))))
    assert len(Pool.pids) == 10
    assert [r.getMessage() for r in caplog.records].count(
        "jaxloader: autotune: memory holds the workers to 10 (100 MiB resident each, half of "
        "what is free and theirs): none more is started (those running stay: parked, a worker "
        "keeps its memory)") == 1


def test_a_batch_the_training_process_has_no_memory_for_names_its_step_and_the_limit():
    # num_workers=0 under ulimit -v: NumPy's bare MemoryError from the batch's arrays, no
    # step, no limit, no remedy, where workers said all three (the limits audit)
    script = """
import resource
import numpy as np
import jaxloader as jl
class Big:
    def __len__(self): return 64
    def __getitem__(self, i): return {"x": np.zeros(4 << 20, np.uint8)}
size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (400 << 20), resource.RLIM_INFINITY))
try:
    with jl.DataLoader(Big(), batch_size=64, num_workers=0) as loader:
        next(iter(loader))
except MemoryError as e:
    print(type(e).__name__, e)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.startswith("SharedMemoryError step 0 (epoch 0, record positions 0..63): "
                                 "no memory for its batch in the training process (Unable to "
                                 "allocate 256."), (out.stdout, out.stderr[-2000:])
    assert "address space is limited to" in out.stdout and "ulimit -v" in out.stdout
    assert "use smaller batches" in out.stdout
