"""tf.data and PyTorch's DataLoader over the benchmarks' data, each written the way its own
documentation recommends, so the side-by-side tables compare jaxloader with what a user of each
would run.

Each maker returns a function that opens a fresh, endless iterator of batches (the benchmarks
time a stretch of batches from it), like ``bench_workers.jaxloader_iter``. Neither peer is a
dependency of jaxloader: ``available()`` says which are installed, and the benchmarks leave the
others out of their tables (saying so). PyTorch 2.13's CPU build is on this machine's disk for
Python 3.11 (``pip install torch==2.13.0``); ``pip install tensorflow-cpu`` gives tf.data.

How each peer is driven:
- tf.data, built once (each epoch or timed stretch takes a fresh iterator of it, as an epoch
  loop does), ending in ``prefetch(AUTOTUNE)``, batches out as NumPy. With no per-record
  transform it gathers whole batches from the arrays held as tensors: each epoch a permutation
  (``tf.random.shuffle(tf.range(n))``) cut into batches of indices, then ``tf.gather`` with
  ``num_parallel_calls`` (its vectorised path; 412k records/s here against 369k for
  ``from_tensor_slices(...).batch()`` unshuffled). With a per-record transform it is the documented pipeline,
  ``from_tensor_slices(arrays).shuffle(n).repeat().map(fn, num_parallel_calls).batch()`` (a
  record looked up by index in a map instead ran at 18k records/s), the transform either TF
  ops, traced once and run by tf.data's C++ threads (``tf_map``: what a TF user writes), or
  the benchmark's own Python function through ``tf.numpy_function`` (what porting a NumPy
  transform gives). ``num_parallel_calls`` is the workers asked for (AUTOTUNE for 0).
- PyTorch: ``DataLoader(dataset, batch_size, shuffle=True, drop_last=True, num_workers,
  persistent_workers)`` over a map-style dataset applying the transform in ``__getitem__``,
  collated by ``default_collate`` into tensors; a random transform draws from one NumPy
  generator per worker, seeded from the worker's seed (PyTorch's recipe). Its vectorised path
  gives the dataset ``__getitems__`` (PyTorch 2 hands it the batch's indices) and a collate
  that turns the batch's arrays into tensors.
"""

from __future__ import annotations

import importlib.util
from typing import Callable, Iterator

import numpy as np


def available() -> dict:
    """Which peers this Python can import (by module, without importing them)."""
    return {"tf.data": importlib.util.find_spec("tensorflow") is not None,
            "torch": importlib.util.find_spec("torch") is not None}


# -- tf.data -----------------------------------------------------------------------------------
def tf_data(images: np.ndarray, labels: np.ndarray, batch: int, *, workers: int,
            map_fn: Callable | None = None, random_fn: Callable | None = None,
            tf_map: Callable | None = None, shuffle: bool = True) -> Callable[[], Iterator]:
    """Endless batches of ``{"image", "label"}`` through tf.data (see the module docstring)."""
    import tensorflow as tf

    n = len(labels)
    parallel = workers or tf.data.AUTOTUNE
    if map_fn is None and random_fn is None and tf_map is None:  # whole batches at a time
        images_t, labels_t = tf.constant(images), tf.constant(labels)

        def epoch(_: tf.Tensor) -> tf.data.Dataset:  # one epoch's batches of indices
            order = tf.range(n, dtype=tf.int64)
            order = tf.random.shuffle(order, seed=0) if shuffle else order
            return tf.data.Dataset.from_tensor_slices(
                tf.reshape(order[:n // batch * batch], (n // batch, batch)))

        ds = tf.data.Dataset.from_tensors(0).repeat().flat_map(epoch).map(
            lambda i: {"image": tf.gather(images_t, i), "label": tf.gather(labels_t, i)},
            num_parallel_calls=parallel)
    else:
        ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})
        if shuffle:
            ds = ds.shuffle(n, seed=0, reshuffle_each_iteration=True)
        transform = tf_map if tf_map is not None else _numpy_function(tf, map_fn, random_fn)
        ds = ds.repeat().map(transform, num_parallel_calls=parallel)
        ds = ds.batch(batch, drop_remainder=True)
    ds = ds.prefetch(tf.data.AUTOTUNE)

    def make() -> Iterator:  # a fresh iterator of the one dataset, as an epoch loop makes
        return iter(ds.as_numpy_iterator())
    return make


def _numpy_function(tf, map_fn: Callable | None, random_fn: Callable | None) -> Callable:
    rng = np.random.default_rng(0)  # tf.data's threads share it, as a ported transform would

    def apply(image: np.ndarray, label: np.ndarray) -> tuple:
        record = {"image": image, "label": label}
        record = map_fn(record) if map_fn is not None else random_fn(record, rng)
        return np.ascontiguousarray(record["image"]), record["label"]

    def mapped(record: dict) -> dict:
        shape, dtype = tuple(record["image"].shape), record["image"].dtype.as_numpy_dtype
        probe = {"image": np.zeros(shape, dtype),
                 "label": np.zeros((), np.int64)}
        out = map_fn(probe) if map_fn is not None else random_fn(probe, rng)  # output types
        image, label = tf.numpy_function(apply, [record["image"], record["label"]],
                                         [tf.as_dtype(out["image"].dtype), tf.int64])
        image.set_shape(out["image"].shape)
        label.set_shape(())
        return {"image": image, "label": label}
    return mapped


def tf_crop_flip_normalise(record: dict) -> dict:
    """``bench_workers.crop_flip_normalise`` in TF ops: what a tf.data user would write."""
    import tensorflow as tf

    image = tf.image.random_crop(record["image"], (192, 192, 3))
    image = tf.image.random_flip_left_right(image)
    image = (tf.cast(image, tf.float32) - 127.5) / 127.5
    return {"image": image, "label": record["label"]}


# -- PyTorch -----------------------------------------------------------------------------------
class _Mapped:
    """A map-style dataset: the benchmark's records through its transform, as a torch user
    writes one (``torch.utils.data.Dataset`` is a protocol here; subclassing adds nothing)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, map_fn: Callable | None,
                 random_fn: Callable | None) -> None:
        self.images, self.labels = images, labels
        self.map_fn, self.random_fn = map_fn, random_fn
        self.rng: np.random.Generator | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        record = {"image": self.images[i], "label": self.labels[i]}
        if self.map_fn is not None:
            record = self.map_fn(record)
        if self.random_fn is not None:
            if self.rng is None:  # one generator a worker, from the seed torch gives it
                import torch

                self.rng = np.random.default_rng(torch.initial_seed() % 2**63)
            record = self.random_fn(record, self.rng)
        return record


class _Vectorised(_Mapped):
    def __getitems__(self, indices: list) -> dict:
        rows = np.asarray(indices)
        return {"image": self.images[rows], "label": self.labels[rows]}


def _as_tensors(batch: dict) -> dict:
    import torch

    return {key: torch.from_numpy(value) for key, value in batch.items()}


def torch_loader(images: np.ndarray, labels: np.ndarray, batch: int, *, workers: int,
                 map_fn: Callable | None = None, random_fn: Callable | None = None,
                 vectorised: bool = False, shuffle: bool = True) -> Callable[[], Iterator]:
    """Endless batches through ``torch.utils.data.DataLoader`` (see the module docstring)."""
    import torch
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    if vectorised:
        dataset: _Mapped = _Vectorised(images, labels, None, None)
        extra: dict = {"collate_fn": _as_tensors}
    else:
        dataset, extra = _Mapped(images, labels, map_fn, random_fn), {}
    loader = DataLoader(dataset, batch_size=batch, shuffle=shuffle, drop_last=True,
                        num_workers=workers, persistent_workers=workers > 0, **extra)

    def make() -> Iterator:
        def endless() -> Iterator:
            while True:
                yield from loader
        return endless()
    return make
