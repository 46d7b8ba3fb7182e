"""One host of a two-host run (started by test_multihost.py) whose mesh lists the devices in
another order than the processes: the global batches must still be one process's.

Usage: mesh_order_run.py PROCESS_ID PORT

Prints, on host 0, one line a mesh and loader: its name and "same" or the batches that
differ; and the errors of a batch replicated across the hosts, of one on one device, of
leaves placed at different rows, of a spec of more axes than a leaf and (on both hosts) of
meshes that differ between the hosts.
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
two_axes = jax.make_mesh((2, 2), ("data", "fsdp"))  # "data" spans the processes
shardings = {
    "in process order": jl.data_sharding(Mesh(np.array(jax.devices()), ("data",))),
    "reversed": jl.data_sharding(Mesh(np.array(jax.devices()[::-1]), ("data",))),
    # the batch over ("fsdp", "data"): each process's devices hold rows apart (0, 1, 4, 5)
    "interleaved": jl.data_sharding(two_axes, ("fsdp", "data")),
}
for name, sharding in shardings.items():
    for kw in ({}, {"process_index": int(process_id)}, {"num_workers": 2}):
        with jl.DataLoader(source, batch_size=4, shuffle=True, seed=3, last_batch="pad",
                           sharding=sharding, **kw) as loader:
            got = [np.asarray(multihost_utils.process_allgather(b["y"], tiled=True)).tolist()
                   for b in loader]
        if process_id == "0":
            print(name, "same" if got == reference else f"differs: {got} against {reference}")
try:  # the batch replicated across the processes: each would need every process's rows
    jl.DataLoader(source, batch_size=4, sharding=NamedSharding(two_axes, PartitionSpec()))
except jl.ConfigError as e:
    if process_id == "0":
        print("refused:", e)
try:  # the batch on one device, this process's (made, it failed at the first next())
    jl.DataLoader(source, batch_size=4, sharding=jax.local_devices()[0])
except jl.ConfigError as e:
    if process_id == "0":
        print("one device refused:", e)
try:  # leaves whose shardings put this process at other rows: no one read serves both
    jl.DataLoader(jl.ArraySource({"x": np.arange(22), "y": np.arange(22)}), batch_size=4,
                  sharding={"x": jl.data_sharding(two_axes, "data"),
                            "y": shardings["interleaved"]})
except jl.ConfigError as e:
    if process_id == "0":
        print("mixed rows refused:", e)
try:  # one spec, but meshes of the devices in other orders
    jl.DataLoader(jl.ArraySource({"x": np.arange(22), "y": np.arange(22)}), batch_size=4,
                  sharding={"x": shardings["in process order"], "y": shardings["reversed"]})
except jl.ConfigError as e:
    if process_id == "0":
        print("mixed meshes refused:", e)
try:  # a spec of two axes given to a leaf of one: JAX's bare IndexError on several processes
    both = NamedSharding(two_axes, PartitionSpec("data", "fsdp"))  # (one for all leaves: a
    with jl.DataLoader(jl.ArraySource({"x": np.zeros((22, 2), np.float32), "y": np.arange(22)}),
                       batch_size=4, sharding={"x": both, "y": both}) as loader:  # 1-D one
        # takes its rows' part)
        next(iter(loader))
except jl.ConfigError as e:
    if process_id == "0":
        print("two axes refused:", e)
try:  # the other process's index, given: its devices' rows were read, named as the other's
    jl.DataLoader(source, batch_size=4, sharding=shardings["reversed"],
                  process_index=1 - int(process_id))
except jl.ConfigError as e:
    if process_id == "0":
        print("swapped refused:", e)
uneven = Mesh(np.array(jax.devices()[:3]), ("data",))  # process 0's 2 devices, 1's first
try:  # (each device 2 rows of 6: process 0's 4, 1's 2, where each reads batch_size=3; said
    jl.DataLoader(source, batch_size=3, sharding=jl.data_sharding(uneven))  # "not split")
except jl.ConfigError as e:
    print("uneven refused:", e)
mine = jax.local_devices()  # a mesh of each process's own devices first: each read the rows
own_first = Mesh(np.array(mine + [d for d in jax.devices() if d not in mine]), ("data",))
try:  # of its devices in its own mesh, the same rows as the other (half the data, no word)
    with jl.DataLoader(source, batch_size=4, sharding=jl.data_sharding(own_first)) as loader:
        next(iter(loader))
except jl.ConfigError as e:
    print("own meshes refused:", e)
local = jl.data_sharding(Mesh(np.array(mine), ("data",)))  # this process's devices alone
try:  # (its remedy was process_count=1 and make_array_from_process_local_data: the same rows)
    with jl.DataLoader(source, batch_size=4, sharding=local) as loader:
        next(iter(loader))
except jl.ConfigError as e:
    print("local mesh refused:", e)
with jl.DataLoader(source, batch_size=4, sharding=local, process_index=0,  # (each process's
                   process_count=1) as loader:  # own batch on its own devices: was refused)
    placed = next(iter(loader))["y"]
    print("local mesh by hand", placed.shape, placed.is_fully_addressable)
print("done", process_id)
