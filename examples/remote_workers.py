"""The digits job with its augmentation made on Ray actors: workers on other machines.

Run: ``python examples/remote_workers.py`` (needs ``pip install -e ".[examples,ray]"``): on the
Ray cluster at ``--address`` (or ``RAY_ADDRESS``), else on a local one started here. The batches
are those of ``examples/train_digits.py`` with local workers, bit for bit (the run checks its
first ones against a loader with 2 local workers): a batch is a function of its step, whichever
process makes it.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jaxloader as jl  # noqa: E402
from jaxloader.ray import RayWorkers  # noqa: E402
from train_digits import MLP, augment, digits_split, train_step_of  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="a Ray cluster's address (default: a local cluster)")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.actors, include_dashboard=False, log_to_driver=False)
    train, test = digits_split()

    def loader(**where) -> jl.DataLoader:
        return jl.DataLoader(jl.ArraySource(train), batch_size=64, shuffle=True, seed=0,
                             transforms=[jl.RandomMap(augment)], num_epochs=None, **where)

    with loader(num_workers=2) as local:
        expected = [batch for _, batch in zip(range(5), local)]
    model, tx = MLP(), optax.adam(3e-3)
    params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8)))
    state = {"params": params, "opt_state": tx.init(params)}

    train_step = train_step_of(model, tx)

    with loader(workers=RayWorkers(args.actors)) as remote:
        print(f"{args.actors} Ray actors, pids {remote.worker_pids}")
        for step, batch in zip(range(args.steps), remote):
            if step < len(expected):
                assert all(np.array_equal(batch[k], expected[step][k]) for k in batch), step
            state, loss = train_step(state, batch)
            if (step + 1) % 100 == 0:
                print(f"step {step + 1}: loss {float(loss):.4f}")
    print(f"the first {len(expected)} batches were those of 2 local workers, bit for bit")
    logits = model.apply(state["params"], jnp.asarray(test["image"]))
    accuracy = float((jnp.argmax(logits, -1) == test["label"]).mean())
    print(f"test accuracy: {accuracy:.4f} on {len(test['label'])} held-out digits")
    ray.shutdown()


if __name__ == "__main__":
    main()
