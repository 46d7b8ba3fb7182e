"""Train a small byte-level Flax language model on packed sequences of Python's own sources.

Run: ``python examples/train_lm.py`` (needs ``pip install -e .[examples]``); run it again to
continue from the latest checkpoint (``--fresh`` starts over). No download: the text is the
standard library's ``.py`` files of the Python that runs it (sorted by path, the first
``--files`` of them; every ``--held-out``-th of those is kept for evaluation).

What it shows:
- each file is a document of bytes (tokens 1..256, 0 is padding) in a ``RaggedSource``;
- ``PackedSource`` packs the documents into rows of ``--length`` tokens with best-fit (files
  longer than a row are split into row-sized pieces) and gives each row
  ``tokens_segment_ids`` and ``tokens_positions``: attention stays within a document
  (segment mask and causal mask), positions restart at each document, and the loss skips
  padding and the step from one document into the next;
- the packed rows are an ordinary source: 2 workers, a device-put thread with 2 batches ready,
  an Orbax ``CheckpointManager`` saving model, optimizer and loader position together; a killed
  run started again gives the very same losses as a run never interrupted;
- the held-out modules are evaluated as a stream would be (a shard each, read in order):
  ``PackedStream`` packs them the same way, and ``StreamLoader(num_epochs=1)`` makes one pass
  that ends, every token once, the rows that pad its last batches masked (``batch["mask"]``).
"""

from __future__ import annotations

import argparse
import glob
import os
import sysconfig

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
from train_digits import (counted, loss_log, open_checkpoints, report,  # (examples/ on the
                          stop_said)  # path)

VOCAB = 257  # bytes + 1; 0 is padding


def stdlib_paths(files: int, held_out: int) -> tuple[list[str], list[str]]:
    """The first ``files`` standard-library modules (sorted by path): those to train on, and
    every ``held_out``-th one, kept for evaluation (none if ``held_out`` is 0)."""
    paths = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:files]
    kept = [p for i, p in enumerate(paths) if held_out and i % held_out == held_out - 1]
    return [p for p in paths if p not in kept], kept


def read_tokens(path: str) -> np.ndarray:
    """A module's bytes shifted by one (0 is padding)."""
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8).astype(np.int32) + 1


def stdlib_documents(paths: list[str]) -> jl.RaggedSource:
    """The modules ``paths``, one document each."""
    return jl.RaggedSource.from_sequences({"tokens": [read_tokens(p) for p in paths]},
                                          dtype=np.int32)


class ModuleShard:
    """Shard ``i`` of the held-out stream: one module, one record (picklable for workers)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __call__(self, i: int) -> list[dict]:
        return [{"tokens": read_tokens(self.paths[i])}]


class Block(nn.Module):
    heads: int
    width: int

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        y = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(y, y, mask=mask)
        y = nn.LayerNorm()(x)
        return x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(y)))


class ByteLM(nn.Module):
    """A tiny decoder: token and position embeddings, attention within each segment."""

    width: int = 64
    layers: int = 2
    heads: int = 4
    length: int = 256

    @nn.compact
    def __call__(self, tokens: jax.Array, segments: jax.Array, positions: jax.Array) -> jax.Array:
        # Embeddings as one-hot products: a table lookup (a gather) over a batch split on an
        # Explicit mesh axis needs an out_sharding on JAX 0.12; a matmul keeps the batch split.
        embed = nn.Dense(self.width, use_bias=False, name="embed")
        place = nn.Dense(self.width, use_bias=False, name="place")
        x = embed(jax.nn.one_hot(tokens, VOCAB)) + place(jax.nn.one_hot(positions, self.length))
        same = segments[:, :, None] == segments[:, None, :]
        causal = jnp.tril(jnp.ones((tokens.shape[1], tokens.shape[1]), bool))
        mask = (same & causal & (segments[:, :, None] > 0))[:, None]  # (batch, 1, L, L)
        for _ in range(self.layers):
            x = Block(self.heads, self.width)(x, mask)
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


def token_losses(logits: jax.Array, batch: dict) -> tuple[jax.Array, jax.Array]:
    """Cross-entropy of each token's successor, and where it counts: within the same document
    (segment), on rows that are not padding (a pass's ``mask``, where the batch has one)."""
    tokens, segments = batch["tokens"], batch["tokens_segment_ids"]
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    if "mask" in batch:
        same = same & batch["mask"][:, None]
    losses = optax.softmax_cross_entropy(logits[:, :-1], jax.nn.one_hot(tokens[:, 1:], VOCAB))
    return losses, same


def next_token_loss(logits: jax.Array, batch: dict) -> jax.Array:
    """Mean cross-entropy of each token's successor within the same document (segment)."""
    losses, same = token_losses(logits, batch)
    return (losses * same).sum() / jnp.maximum(same.sum(), 1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,  # (stop_said
                                     # reads --fresh by its name)
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=counted(1), default=300, help="total training steps")
    parser.add_argument("--batch-size", type=counted(1), default=16)
    parser.add_argument("--length", type=counted(1), default=256, help="tokens per packed row")
    parser.add_argument("--files", type=counted(1), default=200,
                        help="standard-library modules read")
    parser.add_argument("--held-out", type=counted(0), default=10,
                        help="every n-th module is kept to evaluate on at the end (0: none)")
    parser.add_argument("--workers", type=counted(0), default=2)
    parser.add_argument("--seed", type=counted(0), default=0)
    parser.add_argument("--save-every", type=counted(1), default=50)
    parser.add_argument("--checkpoint-dir", default=os.path.join("checkpoints", "lm"))
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint (the default when there is one)")
    parser.add_argument("--fresh", action="store_true",
                        help="delete --checkpoint-dir first and start a new run")
    parser.add_argument("--loss-log", help="append every step's loss here, as JSON lines")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    manager = open_checkpoints(args)  # first: a finished run is reported at once
    train_paths, eval_paths = stdlib_paths(args.files, args.held_out)
    packed = jl.PackedSource(stdlib_documents(train_paths), "tokens", args.length,
                             method="best_fit", seed=args.seed)
    print(f"{packed!r}")
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    loader = jl.DataLoader(packed, batch_size=args.batch_size, shuffle=True, seed=args.seed,
                           num_workers=args.workers, num_epochs=None,
                           sharding=jl.data_sharding(mesh, "data"), device_prefetch=2)
    model = ByteLM(length=args.length)
    tx = optax.adamw(1e-3)
    example = jnp.zeros((1, args.length), jnp.int32)
    params = model.init(jax.random.key(args.seed), example, example + 1, example)
    replicated = NamedSharding(mesh, PartitionSpec())
    state = jax.device_put({"params": params, "opt_state": tx.init(params)}, replicated)

    @jax.jit
    def train_step(state, batch):
        def loss_fn(p):
            logits = model.apply(p, batch["tokens"], batch["tokens_segment_ids"],
                                 batch["tokens_positions"])
            return next_token_loss(logits, batch)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates),
                "opt_state": opt_state}, loss

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
        with loader, jax.set_mesh(mesh):
            batches = iter(loader)
            progress = tqdm(range(step, args.steps), initial=step, total=args.steps, desc="train",
                            mininterval=1.0)
            for step in progress:
                state, loss = train_step(state, next(batches))
                report(step + 1, loss, log, progress, loader)
                manager.save(step + 1, args=ocp.args.Composite(  # the last step always: a run
                    state=ocp.args.StandardSave(state), loader=LoaderSave(loader)),  # found done
                             force=step + 1 == args.steps)
    finally:  # (a Ctrl-C too: the checkpoint being written is finished, where the
        manager.wait_until_finished()  # interpreter's shutdown refused Orbax's commit
        manager.close()  # thread, losing that checkpoint with an error printed)
    print(f"final loss: {float(loss):.4f} (bits per byte {float(loss) / np.log(2):.3f})")
    if eval_paths:
        evaluate(model, state["params"], eval_paths, args, mesh)


def evaluate(model: ByteLM, params: dict, paths: list[str], args: argparse.Namespace,
             mesh: jax.sharding.Mesh) -> None:
    """One pass over the held-out modules, packed as training packs them: the mean loss a
    token, every token counted once."""
    stream = jl.Stream.from_generator(ModuleShard(paths), shards=len(paths))
    held_out = jl.PackedStream(stream, "tokens", args.length, method="best_fit")
    loader = jl.StreamLoader(held_out, batch_size=args.batch_size, num_epochs=1,
                             num_workers=min(args.workers, len(paths)),
                             sharding=jl.data_sharding(mesh, "data"))

    @jax.jit
    def eval_step(params, batch):
        logits = model.apply(params, batch["tokens"], batch["tokens_segment_ids"],
                             batch["tokens_positions"])
        losses, counted = token_losses(logits, batch)
        return (losses * counted).sum(), counted.sum()

    total, count = jnp.zeros(()), jnp.zeros((), jnp.int32)  # summed on the device: no wait
    with loader, jax.set_mesh(mesh):
        for batch in loader:  # one pass: it ends after the last module's last row
            loss_sum, counted = eval_step(params, batch)
            total, count = total + loss_sum, count + counted
    count = int(count)
    mean = float(total) / max(count, 1)
    print(f"held-out loss: {mean:.4f} (bits per byte {mean / np.log(2):.3f}) over {count:,} "
          f"predicted bytes of {len(paths)} modules")


if __name__ == "__main__":
    stop_said(main)
