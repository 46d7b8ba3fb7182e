"""Run inside a 64 MB /dev/shm (started by test_shm.py in a mount namespace of its own).

Usage: small_shm_run.py CASE, CASE one of:
  source   a 210 MB in-memory source, 2 workers, 50 batches, checked against 0 workers
  batches  8 MB batches, 2 workers, 50 batches, checked against 0 workers
  posix    the same 210 MB source on POSIX shared memory: refused at construction
Prints "ok CASE" and what /dev/shm holds afterwards.
"""

import os
import sys

import numpy as np

import jaxloader as jl
from jaxloader.runtime import shm

case = sys.argv[1]
if case == "batches":
    x = np.arange(400 * 131_072, dtype=np.float64).reshape(400, 131_072)  # 1 MiB records
    source, batch_size = jl.ArraySource({"x": x}), 8  # 8 MiB batches
else:
    x = np.arange(210 * 2**20 // 8, dtype=np.float64).reshape(-1, 1024)  # 210 MiB
    source, batch_size = jl.ArraySource({"x": x, "y": np.arange(len(x))}), 16


def loader(workers: int) -> jl.DataLoader:
    return jl.DataLoader(source, batch_size=batch_size, shuffle=True, seed=0, num_epochs=None,
                         num_workers=workers, process_index=0, process_count=1)


if case == "posix":
    shm.MEMFD_AVAILABLE = False  # what a platform without memory files gets
    try:
        loader(2)
    except jl.SharedMemoryError as e:
        print("refused:", e)
else:
    with loader(2) as with_workers, loader(0) as reference:
        got, want = iter(with_workers), iter(reference)
        for _ in range(50):
            assert np.array_equal(next(got)["x"], next(want)["x"])
held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
        if os.path.exists(f"/proc/self/fd/{fd}")]
assert not any("memfd:jaxloader" in link for link in held), held
print("ok", case, "left in /dev/shm:", sorted(os.listdir("/dev/shm")))
