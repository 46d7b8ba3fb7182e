"""One host of a two-host run (started by test_multihost.py) whose mesh lists the devices in
another order than the processes: the global batches must still be one process's.

Usage: mesh_order_run.py PROCESS_ID PORT

Prints, on host 0, one line a mesh: its name and "same" or the batches that differ; and the
errors of a process_index that the sharding contradicts and of a batch replicated across the
hosts.
"""

import sys

import jax

process_id, port = sys.argv[1:3]
jax.config.update("jax_num_cpu_devices", 2)
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                           process_id=int(process_id))

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import jaxloader as jl  # noqa: E402

# made after jax.distributed.initialize() and before JAX's runtime started: JAX's place
plain = jl.DataLoader(jl.ArraySource({"y": np.arange(8)}), batch_size=2)
print("place", plain.process_index, plain.process_count)
source = jl.ArraySource({"y": np.arange(22, dtype=np.int32)})
with jl.DataLoader(source, batch_size=8, shuffle=True, seed=3, last_batch="pad",
                   process_index=0, process_count=1) as one:
    reference = [b["y"].tolist() for b in one]
meshes = {"in process order": Mesh(np.array(jax.devices()), ("data",)),
          "reversed": Mesh(np.array(jax.devices()[::-1]), ("data",))}
for name, mesh in meshes.items():
    with jl.DataLoader(source, batch_size=4, shuffle=True, seed=3, last_batch="pad",
                       sharding=jl.data_sharding(mesh)) as loader:
        got = [np.asarray(multihost_utils.process_allgather(b["y"], tiled=True)).tolist()
               for b in loader]
    if process_id == "0":
        print(name, "same" if got == reference else f"differs: {got} against {reference}")
reversed_mesh = meshes["reversed"]
for kw in ({"process_index": int(process_id)},
           {"sharding": NamedSharding(reversed_mesh, PartitionSpec())}):
    try:
        jl.DataLoader(source, batch_size=4, **{"sharding": jl.data_sharding(reversed_mesh),
                                               **kw})
    except jl.ConfigError as e:
        if process_id == "0":
            print("refused:", e)
print("done", process_id)
