"""The one resume harness: stop at step k, restore into a fresh loader, compare the rest.

``make_loader()`` builds a fresh loader of one configuration. The stream is read the way an
epoch-loop user reads it (``iter()`` again when an epoch ends), so epoch boundaries are crossed
by restores too. Batches are compared bit for bit (dtype, shape and bytes of every leaf).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np

from jaxloader.base.tree import flatten, unflatten


def take(loader: Any, n: int) -> list:
    """The next ``n`` batches, re-entering ``iter(loader)`` whenever an epoch ends."""
    out: list = []
    it = iter(loader)
    while len(out) < n:
        try:
            out.append(next(it))
        except StopIteration:
            it = iter(loader)
    return out


def assert_same_batch(a: Any, b: Any, where: str = "") -> None:
    leaves_a, def_a = flatten(a)
    leaves_b, def_b = flatten(b)
    assert def_a == def_b, f"{where}: structure {def_a} != {def_b}"
    for i, (x, y) in enumerate(zip(leaves_a, leaves_b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, f"{where} leaf {i}: {x.dtype}{x.shape} != {y.dtype}{y.shape}"
        if x.dtype.hasobject:
            assert x.tolist() == y.tolist(), f"{where} leaf {i} differs"
        else:
            assert x.tobytes() == y.tobytes(), f"{where} leaf {i} differs:\n{x}\n{y}"


def assert_same_stream(a: list, b: list, where: str = "") -> None:
    assert len(a) == len(b), f"{where}: {len(a)} batches != {len(b)}"
    for s, (x, y) in enumerate(zip(a, b)):
        assert_same_batch(x, y, f"{where} batch {s}")


def check_resume(make_loader: Callable[[], Any], total: int, k: int,
                 make_restored: Callable[[], Any] | None = None) -> None:
    """Stopping after ``k`` of ``total`` batches and restoring continues the same stream."""
    with make_loader() as loader:
        reference = [_copy(b) for b in take(loader, total)]
    _check_resumed(make_loader, make_restored or make_loader, reference, k)


def check_resume_at_every_step(make_loader: Callable[[], Any], total: int) -> None:
    """``check_resume`` at every ``k`` of ``total`` batches, against one reference run."""
    with make_loader() as loader:
        reference = [_copy(b) for b in take(loader, total)]
    for k in range(total):
        _check_resumed(make_loader, make_loader, reference, k)


def _check_resumed(make_loader: Callable[[], Any], make_restored: Callable[[], Any],
                   reference: list, k: int) -> None:
    with make_loader() as first:
        head = [_copy(b) for b in take(first, k)]
        state = json.loads(json.dumps(first.state_dict()))  # must survive JSON
    with make_restored() as second:
        second.load_state_dict(state)
        tail = [_copy(b) for b in take(second, len(reference) - k)]
    assert_same_stream(head + tail, reference, f"resume at k={k}")


def check_split_resume(make: Callable[..., Callable[[], Any]], batch_size: int, k: int,
                       steps: int, keys: tuple[str, ...]) -> None:
    """A state saved by one process (``batch_size``) after ``k`` batches, restored into two
    processes of half the batch each, gives the same global batches for ``steps`` more steps.

    ``make(batch_size=, process_index=, process_count=)`` returns a loader factory.
    """
    with make(batch_size=batch_size)() as whole:
        reference = take(whole, k + steps)
    with make(batch_size=batch_size)() as first:
        take(first, k)
        state = json.loads(json.dumps(first.state_dict()))
    hosts = []
    for p in range(2):
        with make(batch_size=batch_size // 2, process_index=p, process_count=2)() as host:
            host.load_state_dict(state)
            hosts.append(take(host, steps))
    for step, (a, b) in enumerate(zip(*hosts)):
        for key in keys:
            got = np.concatenate([np.asarray(a[key]), np.asarray(b[key])])
            assert np.array_equal(got, reference[k + step][key]), f"step {k + step}, {key}"


def _copy(batch: Any) -> Any:
    leaves, treedef = flatten(batch)
    return unflatten(treedef, [np.array(x, copy=True) for x in leaves])
