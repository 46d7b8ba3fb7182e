"""One host of a two-host run (started by test_multihost.py): jax.distributed on the CPU backend.

Usage: multihost_run.py PROCESS_ID PORT OUT_DIR STEPS [SAVE_AT | resume]

BatchRuns the loader (2 workers, sharded over both hosts' devices), gathers each global batch and,
on host 0, saves the stream. The mesh has Explicit axes when saving and Auto axes when resuming,
so that both kinds assemble the same global batches. With SAVE_AT it also writes each host's state after SAVE_AT steps;
with "resume" it first loads OUT_DIR/resume_state.json and continues from there.
"""

import json
import sys

import jax

process_id, port, out_dir, steps, mode = sys.argv[1:6]
jax.config.update("jax_num_cpu_devices", 2)
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                           process_id=int(process_id))

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

import jaxloader as jl  # noqa: E402
from sharding.multihost_config import make_loader  # noqa: E402

axis_type = AxisType.Auto if mode == "resume" else AxisType.Explicit
mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(axis_type,))
loader = make_loader(batch_size=4, num_workers=2, sharding=jl.data_sharding(mesh))
assert loader.state_dict()["process_count"] == 2
if mode == "resume":
    with open(f"{out_dir}/resume_state.json") as f:
        loader.load_state_dict(json.load(f))
stream = {"x": [], "y": []}
it = iter(loader)
for step in range(int(steps)):
    batch = next(it)
    assert batch["x"].sharding == jl.data_sharding(mesh) and batch["x"].shape[0] == 8
    for key in stream:
        stream[key].append(np.asarray(multihost_utils.process_allgather(batch[key], tiled=True)))
    if mode != "resume" and step + 1 == int(mode):
        with open(f"{out_dir}/state_{process_id}.json", "w") as f:
            json.dump(loader.state_dict(), f)
loader.close()
if mode != "resume":  # a JitMap in this process (num_workers=0) on every host: it ran on
    # jax.devices("cpu")[0], process 0's, which process 1 cannot address
    import jax.numpy as jnp  # noqa: E402

    with jl.DataLoader(jl.ArraySource({"x": np.arange(16.0)}), batch_size=4,
                       transforms=[jl.JitMap(lambda r: {"x": jnp.sqrt(r["x"])})]) as jitted:
        assert np.allclose(next(iter(jitted))["x"] ** 2, np.arange(4.0) + 4 * int(process_id))
if process_id == "0":
    np.savez(f"{out_dir}/stream_{mode}.npz", **{k: np.stack(v) for k, v in stream.items()})
print("done", process_id)
