"""Train a small Flax MLP on scikit-learn's bundled digits (8x8 images), fed by jaxloader.

Run: ``python examples/train_digits.py`` (needs ``pip install -e .[examples]``). Run it again
and it continues from its latest checkpoint (or says the run is finished); ``--fresh`` starts
over. No download: the digits ship inside scikit-learn.

What it shows:
- 2 worker processes read records and augment them with a ``RandomMap`` (a random shift and
  pixel noise) whose randomness depends only on ``(seed, epoch, position)``;
- a device-put thread shards each batch over the local devices (``data_sharding``) and keeps
  2 batches ready on device; the mesh has Explicit axes (today's ``jax.make_mesh`` default) and is
  set around the training loop with ``jax.set_mesh``, so each batch's type says it is split over
  ``"data"``: ``float32[64@data,8,8]``;
- an Orbax ``CheckpointManager`` saves model, optimizer and loader position together every
  ``--save-every`` steps; a run started again continues exactly where the checkpoint was
  taken, so a killed run resumed gives the very same losses as a run never interrupted.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.sharding import AxisType, NamedSharding, PartitionSpec
from tqdm import tqdm

import jaxloader as jl
from jaxloader.checkpoint import LoaderRestore, LoaderSave


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: 1,797 images of 8x8 pixels (0 to 16) and their labels, read from
    the file scikit-learn ships them in, without importing scikit-learn (most of this
    script's start, for a 100 KB file); through ``sklearn.datasets.load_digits`` where that
    file is not found."""
    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec else []
    shipped = [os.path.join(f, "datasets", "data", "digits.csv.gz") for f in folders]
    if shipped and os.path.exists(shipped[0]):
        table = np.loadtxt(shipped[0], delimiter=",")
        return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as from_sklearn

    data = from_sklearn()
    return data.images, data.target


def digits_split(test_fraction: float = 0.2) -> tuple[dict, dict]:
    pixels, target = load_digits()
    images = (pixels / 16.0).astype(np.float32)  # 8x8 in [0, 1]
    labels = target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(labels))
    cut = int(len(labels) * (1 - test_fraction))
    train, test = order[:cut], order[cut:]
    return ({"image": images[train], "label": labels[train]},
            {"image": images[test], "label": labels[test]})


def augment(record: dict, rng: np.random.Generator) -> dict:
    """Shift the image by up to one pixel and add a little noise."""
    dy, dx = rng.integers(-1, 2, size=2)
    image = np.roll(record["image"], (dy, dx), axis=(0, 1))
    image = image + rng.normal(0.0, 0.05, image.shape).astype(np.float32)
    return {"image": image, "label": record["label"]}


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(128)(x))
        return nn.Dense(10)(x)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of integer labels, for a batch split over a mesh axis.

    One-hot labels keep the batch axis sharded through the loss and its gradient on both kinds
    of mesh. (``optax.softmax_cross_entropy_with_integer_labels`` gathers along the class axis;
    on JAX 0.12 the gradient of that gather over an Explicit-axis batch needs an
    ``out_sharding`` that the loss cannot give.)
    """
    return optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, logits.shape[-1])).mean()


def parse_args(argv: list[str] | None = None,
               checkpoint_dir: str = os.path.join("checkpoints", "digits"),
               description: str | None = __doc__) -> argparse.Namespace:
    """The job's flags (``argv``, else the command line's); ``checkpoint_dir`` is
    ``--checkpoint-dir``'s default (the NNX example keeps its runs apart from this one's),
    ``description`` what ``--help`` says (the NNX example's own docstring)."""
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False,  # (--fre
                                     # was --fresh, which the Ctrl-C line reads by its name)
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=counted(1), default=1000, help="total training steps")
    parser.add_argument("--batch-size", type=counted(1), default=64)
    parser.add_argument("--workers", type=counted(0), default=2)
    parser.add_argument("--seed", type=counted(0), default=0)
    parser.add_argument("--save-every", type=counted(1), default=100)
    parser.add_argument("--checkpoint-dir", default=checkpoint_dir)
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint (the default when there is one)")
    parser.add_argument("--fresh", action="store_true",
                        help="delete --checkpoint-dir first and start a new run")
    parser.add_argument("--loss-log", help="append every step's loss here, as JSON lines")
    return parser.parse_args(argv)


def counted(low: int) -> Any:
    """An argparse type: an int of at least ``low`` (``--save-every 0`` failed inside Orbax as
    a ZeroDivisionError)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {value}")
        return value
    return parse


def digits_loader(args: argparse.Namespace, train: dict, mesh: jax.sharding.Mesh) -> jl.DataLoader:
    """Shuffled, augmented in 2 workers, each batch split over the mesh's ``"data"`` axis and
    2 batches kept ready on the devices."""
    return jl.DataLoader(
        jl.ArraySource(train), batch_size=args.batch_size, shuffle=True, seed=args.seed,
        transforms=[jl.RandomMap(augment)], num_workers=args.workers, num_epochs=None,
        sharding=jl.data_sharding(mesh, "data"), device_prefetch=2,
    )


def profile_loader(num_workers: int = 2) -> jl.DataLoader:
    """The job's loader with ``num_workers``, for ``python -m jaxloader.profile
    examples/train_digits.py:profile_loader`` (the loader alone, without the model)."""
    args = argparse.Namespace(batch_size=64, seed=0, workers=num_workers)
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    return digits_loader(args, digits_split()[0], mesh)


def open_checkpoints(args: argparse.Namespace) -> ocp.CheckpointManager:
    """The run's Orbax ``CheckpointManager`` in ``--checkpoint-dir``, said where. A run found
    there is continued from its latest checkpoint (``args.resume`` set: running the command
    again after a crash or a Ctrl-C goes on); a run found finished is reported and the script
    exits 0; ``--fresh`` deletes the directory first and starts over. A directory this process
    may not write, or one another run is training in, is said and the script exits 1 (Orbax's
    save failed after the restore, and its threads then kept the process from ending)."""
    if "://" in args.checkpoint_dir:  # (made a local folder "gs:", failed after 100 steps)
        raise SystemExit(f"--checkpoint-dir {args.checkpoint_dir}: this example keeps its "
                         "checkpoints in a local folder (it locks the folder with a file beside "
                         "it); pass a local path, or mount the bucket as a folder (gcsfuse)")
    directory = os.path.abspath(args.checkpoint_dir)
    try:  # (the lock beside the folder: --fresh deletes the folder, and would its lock)
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        lock = open(directory + ".lock", "a")
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (held while the process lives)
        _HELD.append(lock)
        if args.fresh and os.path.isdir(directory):
            shutil.rmtree(directory)
        os.makedirs(directory, exist_ok=True)
        os.unlink(tempfile.mkstemp(dir=directory)[1])  # (the folder itself is written)
    except BlockingIOError:
        raise SystemExit(f"another run is training in {directory} (it holds {directory}.lock); "
                         "wait for it to end, or pass another --checkpoint-dir") from None
    except OSError as e:
        raise SystemExit(f"cannot write checkpoints to {directory} ({e.strerror}); pass "
                         "--checkpoint-dir a folder this process may write") from None
    manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(save_interval_steps=args.save_every, max_to_keep=2),
    )
    latest = manager.latest_step()
    if latest is not None and latest >= args.steps:
        manager.close()
        print(f"trained to step {latest} in {directory}; --fresh to train again, or "
              f"--steps N (over {latest}) to train on from there")
        raise SystemExit(0)
    if args.resume and latest is None:
        print(f"--resume: no checkpoint in {directory} yet; a new run starts")
    args.resume = latest is not None
    print(f"checkpoints: {directory}, every {args.save_every} steps"
          + (f"; continuing the run there from step {latest} (--fresh to start over)"
             if args.resume else "; run it again" + (" without --fresh" if args.fresh else
                                                      " the same way") + " to continue after a stop"))
    return manager


_HELD: list = []  # the run's lock, held while the process lives


def loss_log(args: argparse.Namespace, step: int) -> Any:
    """``--loss-log`` opened to append; a run starting at ``step`` first drops its lines of
    later steps: those a stopped run logged after its last checkpoint, or all of them where it
    stopped before its first, or for ``--fresh`` (the log held those steps twice; lines of no
    step are kept). ``None`` without ``--loss-log``."""
    if not args.loss_log:
        return None
    if os.path.exists(args.loss_log):
        with open(args.loss_log) as f:
            kept = [line for line in f if _logged_step(line) <= step]
        with open(args.loss_log, "w") as f:
            f.writelines(kept)
    return open(args.loss_log, "a")


def _logged_step(line: str) -> int:
    """A loss log line's step; 0 for a line of none (kept)."""
    try:
        found = json.loads(line)
    except ValueError:
        return 0
    return found.get("step", 0) if isinstance(found, dict) and isinstance(
        found.get("step", 0), int) else 0


def report(step: int, loss: jax.Array, log: Any, progress: tqdm, loader: jl.DataLoader) -> None:
    """The step's loss into ``--loss-log`` (JSON lines), and every 50 steps onto the bar."""
    if log is not None:
        log.write(json.dumps({"step": step, "loss": float(loss)}) + "\n")
        log.flush()
    if step % 50 == 0:
        progress.set_postfix(loss=f"{float(loss):.4f}", epoch=loader.epoch,  # (drawn with
                             input_wait=f"{loader.stats.wait_fraction:.1%}", refresh=False)
        # the bar's count at its next refresh: drawn now, it showed an older count beside it)


def train_step_of(model: MLP, tx: optax.GradientTransformation) -> Any:
    """The jitted step: ``(state, batch) -> (state, loss)``, state ``{"params", "opt_state"}``."""

    @jax.jit
    def train_step(state, batch):
        def loss_fn(p):
            return cross_entropy(model.apply(p, batch["image"]), batch["label"])

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates),
                "opt_state": opt_state}, loss

    return train_step


def main() -> None:
    args = parse_args()
    manager = open_checkpoints(args)  # first: a finished run is reported at once
    train, test = digits_split()
    # Explicit axes: a batch's sharding is part of its type (AxisType.Auto works the same way).
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    loader = digits_loader(args, train, mesh)
    model = MLP()
    tx = optax.adam(3e-3)
    replicated = NamedSharding(mesh, PartitionSpec())
    params = model.init(jax.random.key(args.seed), jnp.zeros((1, 8, 8)))
    state = jax.device_put({"params": params, "opt_state": tx.init(params)}, replicated)

    train_step = train_step_of(model, tx)

    step = 0
    if args.resume and manager.latest_step() is not None:
        step = manager.latest_step()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), loader=LoaderRestore(loader)))
        state = restored["state"]
        print(f"resumed from step {step} (loader at epoch {loader.epoch}, step {loader.step})")
    log = loss_log(args, step)

    try:
        with loader, jax.set_mesh(mesh):  # the mesh the jitted step's shardings refer to
            batches = iter(loader)
            progress = tqdm(range(step, args.steps), initial=step, total=args.steps, desc="train",
                            mininterval=1.0)
            for step in progress:
                state, loss = train_step(state, next(batches))
                report(step + 1, loss, log, progress, loader)
                manager.save(step + 1, args=ocp.args.Composite(  # the last step always: a run
                    state=ocp.args.StandardSave(state), loader=LoaderSave(loader)),  # found done
                             force=step + 1 == args.steps)
            verdict = loader.diagnose() if loader.stats.batches >= 2 else None
    finally:  # (a Ctrl-C too: the checkpoint being written is finished, where the
        manager.wait_until_finished()  # interpreter's shutdown refused Orbax's commit
        manager.close()  # thread, losing that checkpoint with an error printed)

    logits = model.apply(state["params"], jnp.asarray(test["image"]))
    accuracy = float((jnp.argmax(logits, -1) == test["label"]).mean())
    print(f"test accuracy: {accuracy:.4f} on {len(test['label'])} held-out digits")
    if verdict is not None:  # what limited the input this run, and what to change
        print(verdict)


def stop_said(main: Any) -> None:
    """Runs ``main``; a Ctrl-C ends it with one line that says how to go on (not a traceback:
    the run's checkpoints are finished and kept as it stops)."""
    try:
        main()
    except KeyboardInterrupt:
        again = "without --fresh" if "--fresh" in sys.argv else "the same way"  # (--fresh
        print(f"\nstopped (Ctrl-C); run it again {again} to continue from the latest "
              "checkpoint", file=sys.stderr)  # would delete the checkpoints: the review)
        raise SystemExit(130) from None


if __name__ == "__main__":
    stop_said(main)
