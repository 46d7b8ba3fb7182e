"""A training script interrupted (Ctrl-C) while its workers sit in a slow transform: prints
"ready" once a batch has come, then waits in next() until SIGINT ends it."""

import sys
import time

import numpy as np

import jaxloader as jl


def slow(record):
    if int(record["x"]) >= 8:
        time.sleep(5)
    return record


if __name__ == "__main__":
    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(200)}), batch_size=8, num_workers=2,
                           transforms=[jl.Map(slow)], prefetch=int(sys.argv[1]),
                           process_index=0, process_count=1)
    it = iter(loader)
    next(it)
    print("ready", flush=True)
    for _ in it:
        pass
