"""Reads every row of the Parquet files in a folder under a 1,024-descriptor limit, then says
how many descriptors this process held before the source and after the loader closed (the
worker starter's link, which the process keeps for the loaders to come, not counted).

    python parquet_fd_run.py FOLDER NUM_WORKERS   ->  {"rows": ..., "before": ..., "after": ...}
"""

import glob
import json
import os
import resource
import sys

import numpy as np

import jaxloader as jl
from jaxloader.workers import starter


def _held() -> int:
    kept = {s._socket.fileno() for s in starter._STARTERS.values() if not s.ended}
    return len(set(map(int, os.listdir("/proc/self/fd"))) - kept)


def main() -> None:
    folder, workers = sys.argv[1], int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    paths = sorted(glob.glob(os.path.join(folder, "*.parquet")))
    before = _held()
    source = jl.ParquetSource(paths)
    with jl.DataLoader(source, batch_size=100, shuffle=True, num_workers=workers,
                       last_batch="partial", process_index=0, process_count=1) as loader:
        ids = np.concatenate([batch["id"] for batch in loader])
        loader.peek()  # the main process reads too
    after = _held()
    print(json.dumps({"rows": len(ids), "distinct": len(set(ids.tolist())),
                      "before": before, "after": after}))


if __name__ == "__main__":
    main()
