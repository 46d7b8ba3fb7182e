"""Data-parallel training over N local processes joined by ``jax.distributed`` (CPU backend).

Run: ``python examples/multihost.py --num-processes 2`` (needs ``pip install -e .[examples]``).

The launcher starts N copies of this script, each a "host" with its own devices. Every host runs
a ``DataLoader`` over the same digits with 2 workers; ``batch_size`` is per host, and the loader
assembles the global batch (``batch_size * N`` rows) with
``jax.make_array_from_process_local_data``. The jitted step then runs over all hosts' devices,
and every host ends with the same parameters.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys


def launch(num_processes: int, argv: list[str]) -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv,
                               "--process-id", str(i), "--coordinator", f"localhost:{port}"],
                              env=env) for i in range(num_processes)]
    codes = [p.wait() for p in procs]
    return max(abs(c) for c in codes)


def host(args: argparse.Namespace) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices_per_process)
    jax.distributed.initialize(coordinator_address=args.coordinator,
                               num_processes=args.num_processes, process_id=args.process_id)
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.experimental import multihost_utils
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    import jaxloader as jl
    from train_digits import MLP, augment, digits_split

    train, test = digits_split()
    # every host's devices in one mesh; Explicit axes: the batch's type is f32[64@data,8,8]
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    loader = jl.DataLoader(jl.ArraySource(train), batch_size=args.batch_size, shuffle=True,
                           seed=0, transforms=[jl.RandomMap(augment)], num_workers=2,
                           num_epochs=None, sharding=jl.data_sharding(mesh), last_batch="pad")
    model, tx = MLP(), optax.adam(3e-3)
    replicated = NamedSharding(mesh, PartitionSpec())
    params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8)))
    state = jax.device_put({"params": params, "opt_state": tx.init(params)}, replicated)

    @jax.jit
    def train_step(state, batch):
        def loss_fn(p):
            logits = model.apply(p, batch["image"])
            one_hot = jax.nn.one_hot(batch["label"], logits.shape[-1])  # see train_digits.cross_entropy
            losses = optax.softmax_cross_entropy(logits, one_hot)
            return (losses * batch["mask"]).sum() / batch["mask"].sum()  # pad rows do not count

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates),
                "opt_state": opt_state}, loss

    with loader, jax.set_mesh(mesh):
        batches = iter(loader)
        for _ in range(args.steps):
            batch = next(batches)
            assert batch["image"].shape[0] == args.batch_size * args.num_processes
            state, loss = train_step(state, batch)
    params_host = jax.tree.map(
        lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), state["params"])
    checksum = np.float64(sum(float(np.sum(x)) for x in jax.tree.leaves(params_host)))
    checksums = np.asarray(multihost_utils.process_allgather(checksum))
    logits = model.apply(params_host, jnp.asarray(test["image"]))
    accuracy = float((jnp.argmax(logits, -1) == test["label"]).mean())
    # one write of the whole line: the processes share the launcher's stdout, and print()
    # writes a line and its newline apart when stdout is unbuffered (PYTHONUNBUFFERED=1),
    # so the other process's line once landed between them
    sys.stdout.write(f"process {jax.process_index()}/{jax.process_count()}: "
                     f"{jax.device_count()} devices, global batch "
                     f"{args.batch_size * args.num_processes}, final loss {float(loss):.4f}, "
                     f"test accuracy {accuracy:.4f}, same params on every host: "
                     f"{bool(np.all(checksums == checksums[0]))}\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-processes", type=int, default=2)
    # One CPU device per process by default: with 2 per process, JAX's CPU collectives across
    # processes were seen to hang after ~100 steps on a 2-core machine, without jaxloader too.
    parser.add_argument("--devices-per-process", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process_id is None:
        sys.exit(launch(args.num_processes, sys.argv[1:]))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    host(args)


if __name__ == "__main__":
    main()
