"""The CPUs and memory this process may use: its affinity and the machine's memory, and less
where its cgroup sets a limit (a Kubernetes pod's ``limits.cpu``, ``docker run --cpus=4
--memory=16g``: cgroup v2's ``cpu.max`` and ``memory.max``, v1's ``cpu.cfs_quota_us`` and
``memory.limit_in_bytes``), the least of its cgroup's and those above it. The affinity of a
pod limited to 4 CPUs on a 64-core node lists 64: the advice said to run 64 workers for a
64x speed-up, ``"auto"`` could grow to 64, and ``jl.profile`` tried 64.

Example:
    >>> cores() >= 1 and available_bytes() > 0
    True
"""

from __future__ import annotations

import math
import os

_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")  # (v2 alone, or v1's beside it)


def cores() -> int:
    """The CPUs this process may run on: its affinity's, at most its cgroup's quota (rounded
    up: a limit of 2.5 CPUs keeps 3 busy part of the time)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        affinity = os.cpu_count() or 1
    quotas = _cpu_limits()
    return max(1, min(affinity, math.ceil(min(quotas)))) if quotas else affinity


def available_bytes() -> int:
    """The memory this process may still take: the machine's available memory, at most what
    its cgroup's limit leaves (the limit less what the cgroup uses, its file cache that the
    kernel takes back left out, as the kubelet counts it: a loader's reads fill the cache to
    the limit); 2**62 where unknown."""
    found = [_meminfo_available()]
    for limit, used in _memory_limits():
        found.append(max(0, limit - used))
    known = [n for n in found if n is not None]
    return min(known) if known else 1 << 62


def memory_left() -> str:
    """What memory this process may still take, for a message: its address space's limit
    (``ulimit -v``, as HPC schedulers set it), where it has one, and ``available_bytes``.

    Example:
        >>> "bytes of memory available" in memory_left() or "not known" in memory_left()
        True
    """
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    said = [] if soft == resource.RLIM_INFINITY else [
        f"this process's address space is limited to {soft:,} bytes (ulimit -v, RLIMIT_AS: "
        "raise it)"]
    available = available_bytes()
    if available < 1 << 62:
        said.append(f"{available:,} bytes of memory available to it")
    return "; ".join(said) or "how much memory is left is not known here"


def reservable_bytes() -> int:
    """The memory new shared pages may take before the kernel's out-of-memory killer ends a
    process (the largest, often the training process: a bare SIGKILL, no error): as
    ``available_bytes``, but with the cgroup's whole file cache counted free, active too (the
    kernel takes it back before it kills; not its shared memory, the loader's own segments,
    which the cache counts) and free swap added (where shared pages may go); 2**62 where
    unknown."""
    swap = _meminfo("SwapFree:") or 0
    available = _meminfo_available()
    found = [] if available is None else [available + swap]
    found += [max(0, limit - used) + swap for limit, used in _memory_limits(whole_cache=True)]
    return min(found) if found else 1 << 62


def process_limits() -> str:
    """The limits on this user's processes and threads, for a message: ``ulimit -u``'s, and a
    cgroup's ``pids.max`` with what it holds (a container's, ``docker run --pids-limit``, a
    pod's), the limit reached there where ``ulimit -u`` was nowhere near."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    said = ["ulimit -u " + ("unlimited" if soft == resource.RLIM_INFINITY else f"{soft:,}")]
    for controllers, path in _cgroups():
        if controllers == "" or "pids" in controllers.split(","):
            for cgroup in _up(path):
                folders = [f"{root}{cgroup}" for root in _ROOTS] if controllers == "" else \
                    _v1_folders(controllers, "pids", cgroup)
                for folder in folders:
                    limit, now = _read(f"{folder}/pids.max"), _read(f"{folder}/pids.current")
                    if limit and limit.isdigit() and now and now.isdigit():
                        said.append(f"a cgroup's pids.max {int(limit):,}, {int(now):,} in use "
                                    "(a container's --pids-limit)")
    return "; ".join(dict.fromkeys(said))


def _cgroups() -> list[tuple[str, str]]:
    """``(controllers, path)`` of each of this process's cgroups (``/proc/self/cgroup``)."""
    try:  # (a cgroup's name may hold any bytes)
        with open("/proc/self/cgroup", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError):
        return []
    return [(parts[1], parts[2]) for parts in (line.split(":", 2) for line in lines)
            if len(parts) == 3]


def _up(path: str) -> list[str]:
    """``path`` and each cgroup above it, to the root (a limit may be set on any of them)."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read().strip()
    except (OSError, ValueError):
        return None


def _cpu_limits() -> list[float]:
    """The CPUs each quota on this process's cgroups allows."""
    found = []
    for controllers, path in _cgroups():
        for cgroup in _up(path):
            if controllers == "":  # (v2: "max 100000", or "400000 100000")
                for root in _ROOTS:
                    text = _read(f"{root}{cgroup}/cpu.max")
                    parts = (text or "").split()
                    if len(parts) == 2 and parts[0] != "max" and _positive(parts):
                        found.append(int(parts[0]) / int(parts[1]))
            elif "cpu" in controllers.split(","):  # (v1: a quota of -1 is none)
                for folder in _v1_folders(controllers, "cpu", cgroup):
                    quota, period = (_read(f"{folder}/cpu.cfs_quota_us"),
                                     _read(f"{folder}/cpu.cfs_period_us"))
                    if quota and period and _positive([quota, period]):
                        found.append(int(quota) / int(period))
    return found


def _memory_limits(whole_cache: bool = False) -> list[tuple[int, int]]:
    """``(limit, used)`` of each memory limit on this process's cgroups; used less the file
    cache the kernel takes back first (``whole_cache``: all of it, active too: never the
    shared memory the cache counts, which no swap-less kernel takes back)."""
    found = []
    for controllers, path in _cgroups():
        for cgroup in _up(path):
            if controllers == "":
                files = [(f"{root}{cgroup}/memory.max", f"{root}{cgroup}/memory.current",
                          f"{root}{cgroup}/memory.stat", ("active_file", "inactive_file")[
                              not whole_cache:]) for root in _ROOTS]
            elif "memory" in controllers.split(","):
                files = [(f"{folder}/memory.limit_in_bytes", f"{folder}/memory.usage_in_bytes",
                          f"{folder}/memory.stat",
                          ("total_active_file", "total_inactive_file")[not whole_cache:])
                         for folder in _v1_folders(controllers, "memory", cgroup)]
            else:
                continue
            for limit_file, used_file, stat_file, cache in files:
                limit, used = _read(limit_file), _read(used_file)
                if limit and used and limit.isdigit() and used.isdigit() and int(
                        limit) < 1 << 60:  # ("max"; v1's no limit is about 2**63)
                    found.append((int(limit), max(0, int(used) - sum(
                        _stat(stat_file, key) for key in cache))))
    return found


def _v1_folders(controllers: str, name: str, cgroup: str) -> list[str]:
    """Where cgroup v1's folder of ``cgroup`` may be: under the hierarchy named as
    ``/proc/self/cgroup`` lists its ``controllers`` (``cpu,cpuacct``), and under the link named
    for the controller (RHEL 7's kernel lists ``cpuacct,cpu`` for the folder ``cpu,cpuacct``,
    which the links ``cpu`` and ``cpuacct`` name: its quota was never found)."""
    return [f"/sys/fs/cgroup/{folder}{cgroup}" for folder in dict.fromkeys((controllers, name))]


def _stat(path: str, key: str) -> int:
    """The value of ``key`` in a ``memory.stat`` file (0 where it has none)."""
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _meminfo_available() -> int | None:
    return _meminfo("MemAvailable:")


def _meminfo(key: str) -> int | None:
    """The bytes ``/proc/meminfo`` says for ``key`` (``"MemAvailable:"``), or ``None``."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _positive(parts: list[str]) -> bool:
    return all(p.isdigit() and int(p) > 0 for p in parts)
