"""Reads every row of the Parquet files in a folder under a 1,024-descriptor limit, then says
how many descriptors this process held before the source and after the loader closed.

    python parquet_fd_run.py FOLDER NUM_WORKERS   ->  {"rows": ..., "before": ..., "after": ...}
"""

import glob
import json
import os
import resource
import sys

import numpy as np

import jaxloader as jl


def main() -> None:
    folder, workers = sys.argv[1], int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    paths = sorted(glob.glob(os.path.join(folder, "*.parquet")))
    before = len(os.listdir("/proc/self/fd"))
    source = jl.ParquetSource(paths)
    with jl.DataLoader(source, batch_size=100, shuffle=True, num_workers=workers,
                       last_batch="partial", process_index=0, process_count=1) as loader:
        ids = np.concatenate([batch["id"] for batch in loader])
        loader.peek()  # the main process reads too
    after = len(os.listdir("/proc/self/fd"))
    print(json.dumps({"rows": len(ids), "distinct": len(set(ids.tolist())),
                      "before": before, "after": after}))


if __name__ == "__main__":
    main()
