"""Train a small byte-level Flax language model on packed sequences of Python's own sources.

Run: ``python examples/train_lm.py`` (needs ``pip install -e .[examples]``); add ``--resume``
to continue from the latest checkpoint. No download: the text is the standard library's
``.py`` files of the Python that runs it (sorted by path, the first ``--files`` of them).

What it shows:
- each file is a document of bytes (tokens 1..256, 0 is padding) in a ``RaggedSource``;
- ``PackedSource`` packs the documents into rows of ``--length`` tokens with best-fit (files
  longer than a row are split into row-sized pieces) and gives each row
  ``tokens_segment_ids`` and ``tokens_positions``: attention stays within a document
  (segment mask and causal mask), positions restart at each document, and the loss skips
  padding and the step from one document into the next;
- the packed rows are an ordinary source: 2 workers, a device-put thread with 2 batches ready,
  an Orbax ``CheckpointManager`` saving model, optimizer and loader position together; a killed
  run resumed with ``--resume`` gives the very same losses as a run never interrupted.
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
from train_digits import open_checkpoints, report  # (examples/ is on the path when run)

VOCAB = 257  # bytes + 1; 0 is padding


def stdlib_documents(files: int) -> jl.RaggedSource:
    """The first ``files`` standard-library modules (sorted by path), bytes shifted by one."""
    paths = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:files]
    docs = []
    for path in paths:
        with open(path, "rb") as f:
            docs.append(np.frombuffer(f.read(), np.uint8).astype(np.int32) + 1)
    return jl.RaggedSource.from_sequences({"tokens": docs}, dtype=np.int32)


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


def next_token_loss(logits: jax.Array, batch: dict) -> jax.Array:
    """Mean cross-entropy of each token's successor within the same document (segment)."""
    tokens, segments = batch["tokens"], batch["tokens_segment_ids"]
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    losses = optax.softmax_cross_entropy(logits[:, :-1], jax.nn.one_hot(tokens[:, 1:], VOCAB))
    return (losses * same).sum() / jnp.maximum(same.sum(), 1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="total training steps")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=256, help="tokens per packed row")
    parser.add_argument("--files", type=int, default=200, help="standard-library modules read")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--checkpoint-dir", default=os.path.join("checkpoints", "lm"))
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--fresh", action="store_true",
                        help="delete --checkpoint-dir first and start a new run")
    parser.add_argument("--loss-log", help="append every step's loss here, as JSON lines")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    packed = jl.PackedSource(stdlib_documents(args.files), "tokens", args.length,
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

    manager = open_checkpoints(args)  # the digits example's: refuses to mix runs
    step = 0
    if args.resume and manager.latest_step() is not None:
        step = manager.latest_step()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), loader=LoaderRestore(loader)))
        state = restored["state"]
        print(f"resumed from step {step} (loader at epoch {loader.epoch}, step {loader.step})")
    log = open(args.loss_log, "a") if args.loss_log else None

    with loader, jax.set_mesh(mesh):
        batches = iter(loader)
        progress = tqdm(range(step, args.steps), initial=step, total=args.steps, desc="train",
                        mininterval=1.0)
        for step in progress:
            state, loss = train_step(state, next(batches))
            report(step + 1, loss, log, progress, loader)
            manager.save(step + 1, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), loader=LoaderSave(loader)))
    manager.wait_until_finished()
    manager.close()
    print(f"final loss: {float(loss):.4f} (bits per byte {float(loss) / np.log(2):.3f})")


if __name__ == "__main__":
    main()
