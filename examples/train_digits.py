"""Train a small Flax MLP on scikit-learn's bundled digits (8x8 images), fed by jaxloader.

Run: ``python examples/train_digits.py --steps 1000`` (needs ``pip install -e .[examples]``).
No download: the digits ship inside scikit-learn. Training batches are shuffled every epoch and
augmented per record by a ``RandomMap`` (a random shift and pixel noise) whose randomness depends
only on ``(seed, epoch, position)``, so a run is the same every time.
"""

from __future__ import annotations

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from tqdm import tqdm

import jaxloader as jl


def digits_split(test_fraction: float = 0.2) -> tuple[dict, dict]:
    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)  # 8x8 in [0, 1]
    labels = data.target.astype(np.int32)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    train, test = digits_split()
    loader = jl.DataLoader(
        jl.ArraySource(train), batch_size=args.batch_size, shuffle=True, seed=args.seed,
        transforms=[jl.RandomMap(augment)], num_epochs=None,
    )
    model = MLP()
    params = model.init(jax.random.key(args.seed), jnp.zeros((1, 8, 8)))
    tx = optax.adam(3e-3)
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, batch):
        def loss_fn(p):
            logits = model.apply(p, batch["image"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    with loader:
        batches = iter(loader)
        progress = tqdm(range(args.steps), desc="train", mininterval=1.0)
        for _ in progress:
            params, opt_state, loss = train_step(params, opt_state, next(batches))
            progress.set_postfix(loss=f"{float(loss):.4f}", epoch=loader.epoch, refresh=False)

    logits = model.apply(params, jnp.asarray(test["image"]))
    accuracy = float((jnp.argmax(logits, -1) == test["label"]).mean())
    print(f"test accuracy: {accuracy:.4f} on {len(test['label'])} held-out digits")


if __name__ == "__main__":
    main()
