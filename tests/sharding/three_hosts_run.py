"""One host of a three-host run in which host 2 makes its loader with another seed (started by
test_hosts.py): prints "ok" or "refused: <message>" for its first batch, then "done <id>".

Usage: three_hosts_run.py PROCESS_ID PORT
"""

import sys

import jax

process_id, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=3,
                           process_id=process_id)

import numpy as np  # noqa: E402

import jaxloader as jl  # noqa: E402

with jl.DataLoader(jl.ArraySource({"id": np.arange(60)}), batch_size=4, shuffle=True,
                   seed=1 if process_id == 2 else 0) as loader:
    try:
        next(iter(loader))
        print("ok", flush=True)
    except jl.ConfigError as e:
        print(f"refused: {e}", flush=True)
print("done", process_id, flush=True)
