"""``train_digits.py`` in Flax NNX: the same loader, data and checkpoints, an ``nnx.Module``.

Run: ``python examples/train_digits_nnx.py`` (needs ``pip install -e .[examples]``); run it
again to continue from the latest checkpoint, as ``train_digits.py`` does.

What differs from the Linen example:
- the model and optimizer are objects (``nnx.Module``, ``nnx.Optimizer``) updated in place by
  an ``nnx.jit`` step; the batch from the loader goes in as it comes, a dict of arrays;
- Orbax saves ``nnx.state(model)`` and ``nnx.state(optimizer)`` (pure pytrees of arrays)
  beside the loader's position, and a restore puts them back with ``nnx.update``: a killed run
  resumed gives the very same losses as a run never interrupted (tests/test_examples.py).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import AxisType
from tqdm import tqdm

from jaxloader.checkpoint import LoaderRestore, LoaderSave
from train_digits import (cross_entropy, digits_loader, digits_split, loss_log, open_checkpoints,
                          parse_args, report, stop_said)


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(64, 128, rngs=rngs)
        self.out = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape((x.shape[0], -1))
        return self.out(nnx.relu(self.hidden(x)))


@nnx.jit
def train_step(model: MLP, optimizer: nnx.Optimizer, batch: dict) -> jax.Array:
    def loss_fn(model: MLP) -> jax.Array:
        return cross_entropy(model(batch["image"]), batch["label"])

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def main() -> None:
    args = parse_args(checkpoint_dir=os.path.join("checkpoints", "digits_nnx"),  # its own
                      description=__doc__)
    manager = open_checkpoints(args)  # first: a finished run is reported at once
    train, test = digits_split()
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    loader = digits_loader(args, train, mesh)  # the Linen example's: workers, sharding
    with jax.set_mesh(mesh):  # parameters made here are replicated over the mesh
        model = MLP(nnx.Rngs(args.seed))
        optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)

    step = 0
    if args.resume and manager.latest_step() is not None:
        step = manager.latest_step()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                {"model": nnx.state(model), "optimizer": nnx.state(optimizer)})
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), loader=LoaderRestore(loader)))
        nnx.update(model, restored["state"]["model"])
        nnx.update(optimizer, restored["state"]["optimizer"])
        print(f"resumed from step {step} (loader at epoch {loader.epoch}, step {loader.step})")
    log = loss_log(args, step)

    try:
        with loader, jax.set_mesh(mesh):
            batches = iter(loader)
            progress = tqdm(range(step, args.steps), initial=step, total=args.steps, desc="train",
                            mininterval=1.0)
            for step in progress:
                loss = train_step(model, optimizer, next(batches))
                report(step + 1, loss, log, progress, loader)
                state = {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}
                manager.save(step + 1, args=ocp.args.Composite(  # the last step always: a run
                    state=ocp.args.StandardSave(state), loader=LoaderSave(loader)),  # found done
                             force=step + 1 == args.steps)
    finally:  # (a Ctrl-C too: the checkpoint being written is finished, where the
        manager.wait_until_finished()  # interpreter's shutdown refused Orbax's commit
        manager.close()  # thread, losing that checkpoint with an error printed)

    with jax.set_mesh(mesh):
        logits = model(jnp.asarray(test["image"]))
    accuracy = float((jnp.argmax(logits, -1) == test["label"]).mean())
    print(f"test accuracy: {accuracy:.4f} on {len(test['label'])} held-out digits")


if __name__ == "__main__":
    stop_said(main)
