"""A training process whose workers sit in user code: a transform that sleeps, or a stream
generator that blocks. Prints the workers' pids once both are inside it, then waits to be
killed.

    python orphan_run.py map|stream FOLDER [posix]
"""

import json
import os
import sys
import time

import numpy as np

import jaxloader as jl


def _inside(folder):
    open(os.path.join(folder, f"in-{os.getpid()}"), "w").close()


def main() -> None:
    kind, folder = sys.argv[1], sys.argv[2]
    if sys.argv[3:] == ["posix"]:  # what a system without memory files or /proc gets
        from jaxloader.runtime import shm

        shm.MEMFD_AVAILABLE = shm.PROC_FDS = False

    def asleep(record):
        _inside(folder)
        time.sleep(600)
        return record

    def blocked(shard):
        _inside(folder)
        time.sleep(600)
        yield {"x": np.int64(shard)}

    if kind == "map":
        loader = jl.DataLoader(jl.ArraySource({"x": np.arange(100)}), batch_size=2,
                               num_workers=2, transforms=[jl.Map(asleep)], process_index=0,
                               process_count=1)
    else:
        loader = jl.StreamLoader(jl.Stream.from_generator(blocked, shards=2), batch_size=2,
                                 num_workers=2, process_index=0, process_count=1)
    it = iter(loader)
    import threading

    threading.Thread(target=lambda: next(it), daemon=True).start()  # the workers get tasks
    while len([n for n in os.listdir(folder) if n.startswith("in-")]) < 2:
        time.sleep(0.02)
    print(json.dumps(loader.worker_pids), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
