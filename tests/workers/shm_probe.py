"""What shared memory a process holds, whether any process still holds some, and whether a
process still runs (for tests)."""

from __future__ import annotations

import os


def held_segments(pid: int | str = "self") -> list[str]:
    """The shared memory a process holds: POSIX names in /dev/shm and memory files it has open
    or mapped (``memfd:jaxloader_<token>``)."""
    names = [n for n in os.listdir("/dev/shm")
             if n.startswith(f"jaxloader_{os.getpid() if pid == 'self' else pid}_")]
    return names + sorted(_memfds(pid))


def _memfds(pid) -> set[str]:
    found = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("/memfd:jaxloader"):
                found.add(link.split()[0].lstrip("/"))
        with open(f"/proc/{pid}/maps") as f:
            found.update(line.split()[5].lstrip("/") for line in f
                         if "/memfd:jaxloader" in line)
    except OSError:
        pass
    return found


def still_held(names) -> list[str]:
    """Those of ``names`` that still exist: in /dev/shm, or open or mapped by any process."""
    files = {n for n in names if n.startswith("memfd:")}
    left = [n for n in names if n not in files and os.path.exists(f"/dev/shm/{n}")]
    if files:
        held = set().union(*(_memfds(p) for p in os.listdir("/proc") if p.isdigit()))
        left += sorted(files & held)
    return left


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
