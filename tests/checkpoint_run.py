"""One process of a checkpoint round trip (started by test_checkpoint.py).

Usage: checkpoint_run.py PROCESS_ID NUM_PROCESSES PORT DIR MODE

MODE "save": take 5 global batches, save the loader (and a small model state) through both Orbax
APIs, then record the next 6 global batches. MODE "restore": restore from each API into a fresh
loader and record the next 6 global batches. Process 0 writes the streams to DIR as .npy files.
"""

import sys

import jax

pid, nproc, port, root, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
if nproc > 1:
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=nproc,
                               process_id=pid)

import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from orbax.checkpoint.experimental import v1 as ocp_v1  # noqa: E402

import jaxloader as jl  # noqa: E402
from jaxloader.checkpoint import LoaderRestore, LoaderSave  # noqa: E402

GLOBAL_BATCH, K, MORE = 8, 5, 6


def make_loader():
    source = jl.ArraySource({"x": np.arange(300, dtype=np.float32).reshape(100, 3),
                             "y": np.arange(100, dtype=np.int32)})
    noise = jl.RandomMap(lambda r, rng: {"x": r["x"] + rng.random(3, dtype=np.float32),
                                         "y": r["y"]})
    return jl.DataLoader(source, batch_size=GLOBAL_BATCH // nproc, shuffle=True, seed=2,
                         transforms=[noise], num_workers=1, num_epochs=None)


def global_batches(it, n):
    out = []
    for _ in range(n):
        x = next(it)["x"]
        if nproc > 1:
            x = np.asarray(multihost_utils.process_allgather(x)).reshape(GLOBAL_BATCH, 3)
        out.append(x)
    return np.stack(out)


def save(name, stream):
    if pid == 0:
        np.save(f"{root}/{name}.npy", stream)


model = {"w": np.arange(6.0)}  # NumPy: saved once, by the primary process
if mode == "save":
    with make_loader() as loader:
        it = iter(loader)
        global_batches(it, K)
        manager = ocp.CheckpointManager(f"{root}/classic")
        manager.save(K, args=ocp.args.Composite(state=ocp.args.StandardSave(model),
                                                loader=LoaderSave(loader)))
        manager.wait_until_finished()
        ocp_v1.save_checkpointables(f"{root}/v1", {"state": model, "loader": loader})
        save("expected", global_batches(it, MORE))
else:
    with make_loader() as loader:
        manager = ocp.CheckpointManager(f"{root}/classic")
        restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(
            state=ocp.args.StandardRestore(model), loader=LoaderRestore(loader)))
        assert np.array_equal(restored["state"]["w"], model["w"])
        save(f"classic_into_{nproc}", global_batches(iter(loader), MORE))
    with make_loader() as loader:
        restored = ocp_v1.load_checkpointables(f"{root}/v1", {"state": model, "loader": loader})
        assert loader.step == K
        save(f"v1_into_{nproc}", global_batches(iter(loader), MORE))
print("done", pid)
