"""A batch's last stage: the pad mask's check, the ``BatchMap``s and ``JitMap``s in turn, and the
batch written into its slot (one copy), for both loaders' batch makers.

Example:
    >>> import numpy as np
    >>> from jaxloader.batching.record_columns import batch_columns
    >>> treedef, columns = batch_columns({"x": np.arange(4)}, 4)
    >>> batch, layout = finish_batch(treedef, columns, (), 4, lambda: "step 0")
    >>> batch["x"].tolist()
    [0, 1, 2, 3]
"""

from __future__ import annotations

import functools
import re
import warnings
import weakref
from collections.abc import Mapping
from time import perf_counter
from typing import Any, Callable, cast

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.errors import JaxloaderWarning, RecordError
from jaxloader.base.timings import COMPILED, COLLATE, StageClock, stage_name
from jaxloader.batching import collate
from jaxloader.batching.global_draws import batch_call, batch_said
from jaxloader.batching.jit_map import JitMap
from jaxloader.batching.record_columns import batch_columns
from jaxloader.batching.record_transforms import keys_hint, read_only_hint
from jaxloader.batching.transforms import returned_none


# the transforms found to keep or drop the mask, in this process: (id, mask key) -> a weak
# reference to it (a freed one's id comes again for the next loader's: a sweep's transform
# that dropped the mask went unlooked where one that kept it had been)
_SAID: dict[tuple, Any] = {}


def _dropped_mask(transform: Any, mask_key: str) -> None:
    """Warns, once, that ``transform`` dropped the pad mask and made padded rows as records;
    at the line of its function (in a worker too: the relay says it there)."""
    named = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(transform))  # (the same in each worker)
    _warn_at(transform, (
        f"{named} returned a batch without the {mask_key!r} leaf it was given (False on the "
        "rows that pad a batch: last_batch='pad', or a pass that ends), and made the padded "
        "rows as it made records, so they look like records; return it "
        f"(out[{mask_key!r}] = batch[{mask_key!r}]; in a JitMap, the record's), or use it "
        "(np.where(batch['mask'], labels, -100))"))


def _warn_at(transform: Any, text: str) -> None:
    """A warning at the line of ``transform``'s function (in a worker too: the relay says it
    there), or at the caller's where it has none."""
    fn: Any = getattr(transform, "fn", None)
    while isinstance(fn, functools.partial) or hasattr(fn, "__wrapped__"):  # (jax.jit's too)
        fn = fn.func if isinstance(fn, functools.partial) else fn.__wrapped__
    code = getattr(fn, "__code__", None) or getattr(type(fn).__call__, "__code__", None)
    if code is None:
        warnings.warn(text, JaxloaderWarning, stacklevel=4)
    else:
        warnings.warn_explicit(text, JaxloaderWarning, code.co_filename, code.co_firstlineno,
                               getattr(fn, "__module__", None) or "jaxloader")


def _known_by(transform: Any) -> Any:
    """What ``_SAID`` knows a transform by: a ``JitMap`` by its function (a loader's is its
    own copy, of the user's function, which the user holds), another by itself (one function
    in two ``BatchMap``s, one keeping its mask and one dropping another's)."""
    return transform.fn if type(transform) is JitMap else transform


def _said(transform: Any, mask_key: Any) -> bool:
    """Whether ``transform`` was found to keep or drop the mask ``mask_key``."""
    known = _known_by(transform)
    ref = _SAID.get((id(known), mask_key))
    return ref is not None and ref() is known


def _say(transform: Any, mask_key: Any) -> None:
    known = _known_by(transform)
    key = (id(known), mask_key)
    try:  # (its entry goes with it: each transform ever seen kept one, for the process's life)
        ref: Any = weakref.ref(known, lambda gone: _SAID.pop(key, None) if _SAID.get(key) is gone
                               else None)
    except TypeError:  # (kept alive: its id is not another's while it is)
        ref = lambda: known  # noqa: E731
    _SAID[key] = ref


def _alike(a: Any, b: Any) -> bool:
    """Whether two batches hold the same leaves (NaN equal to NaN)."""
    leaves, others = tree_lib.flatten(a)[0], tree_lib.flatten(b)[0]
    try:
        return len(leaves) == len(others) and all(
            np.array_equal(x, y, equal_nan=np.asarray(x).dtype.kind in "fc")
            for x, y in zip(leaves, others))
    except (TypeError, ValueError):  # (objects, shapes of rows that differ)
        return False


def _copied(batch: Mapping, mask_key: str, given: np.ndarray) -> dict:
    """A copy of ``batch`` (each array copied, at any depth: the transform may write into
    them) whose every row is a record; a dict at its top (a ``FrozenDict`` takes no key)."""
    leaves, treedef = tree_lib.flatten(batch)
    copy = tree_lib.unflatten(treedef, [np.array(x, copy=True) if isinstance(x, np.ndarray)
                                        else x for x in leaves])
    return {**copy, mask_key: np.ones_like(given)}


def _made_again(batch: Any, again: Callable[[], Any]) -> tuple[bool, Any]:
    """Whether ``again()``, the transform made again with every row a record, makes ``batch``
    (then it made the padded rows as records; one that fails made them otherwise, or cannot
    be told: not said), and the batch to hand out: ``batch`` as it was, rebuilt from its
    leaves taken before (a transform that returns a dict of its own each call filled it
    again), a copy of each array the second call wrote into (a buffer it fills each call)."""
    leaves, treedef = tree_lib.flatten(batch)
    kept = [np.copy(x, subok=True) if isinstance(x, np.ndarray) else x for x in leaves]
    try:
        alike = _alike(kept, tree_lib.flatten(again())[0])
    except Exception:  # noqa: BLE001 - the user's function, on another mask
        alike = False
    written = [(leaf, copy) for leaf, copy in zip(leaves, kept) if not _alike([leaf], [copy])]
    now = tree_lib.flatten(batch)[0]
    if len(now) == len(leaves) and all(a is b for a, b in zip(now, leaves)) and all(
            isinstance(leaf, np.ndarray) and leaf.flags.writeable for leaf, _ in written):
        for leaf, copy in written:  # (the batch itself, as the transform made it: its own
            np.copyto(leaf, copy)  # mapping type, which a rebuild would make a dict)
        return alike, batch
    return alike, tree_lib.unflatten(treedef, [
        leaf if _alike([leaf], [copy]) else copy for leaf, copy in zip(leaves, kept)])


def _mask_of(mask_key: str | None, batch: Any, columns: list) -> np.ndarray | None:
    """The pad mask a transform is given: the batch's leaf, or its column (a JitMap's)."""
    if mask_key is None:
        return None
    if batch is not None:
        return batch.get(mask_key) if isinstance(batch, Mapping) else None
    found = [c.values for c in columns if c.path == f"[{mask_key!r}]"]
    return found[0] if found and isinstance(found[0], np.ndarray) else None


def _is_mask(leaf: Any, given: Any) -> bool:
    """Whether ``leaf`` carries the batch's mask ``given`` on: it, or it cast or reshaped (a
    tuple's element of sample weights, ``mask.astype(np.float32)`` or a ``jnp`` array of it,
    as Keras takes them)."""
    if leaf is given:
        return True
    if given is None or np.size(leaf) != np.size(given) or not hasattr(leaf, "__array__"):
        return False
    values = np.asarray(leaf)
    return values.dtype.kind in "biuf" and bool(np.array_equal(values.reshape(-1) != 0, given))


def _same_mask(out: Any, given: np.ndarray) -> bool:
    """Whether a transform returned the pad mask as a pad mask still: a row each first, False
    (or 0) on every row ``given``, the loader's, says pads, and bools or 0s and 1s (the mask
    itself, refined: ``mask & valid``, given more axes: ``mask[:, None]``, or cast:
    ``mask.astype(jnp.bfloat16)``)."""
    try:
        out = np.asarray(out)
        return out.shape[:1] == given.shape and not out[~given].any() and (
            out.dtype == bool or bool(((out == 0) | (out == 1)).all()))
    except Exception:  # noqa: BLE001 - (a leaf NumPy cannot take, or compare: not the mask)
        return False


def _held(given: Any) -> Any:
    """A copy of the mask a transform is given, as given (it may write into it)."""
    return given.copy() if isinstance(given, np.ndarray) else given


def _passed_on(out: Any, held: Any) -> bool:
    """Whether a transform returned the mask it was given (``held``: a copy) as it was."""
    try:
        held = np.asarray(held)
        return bool(np.array_equal(np.asarray(out), held, equal_nan=held.dtype.kind in "fc"))
    except Exception:  # noqa: BLE001 - (a leaf NumPy cannot take or compare)
        return False


def _changed_mask(transform: Any, mask_key: str, given: np.ndarray, out: Any) -> None:
    """Warns, once a transform (Python's rule, at the transform's line), that it returned the
    pad mask changed: a map of the whole tree changed its values (``/ 255``; a cast that keeps
    its 0s and 1s is taken), or a mask of its own took its key."""
    out = np.asarray(out, dtype=object) if not hasattr(out, "dtype") else out
    named = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(transform))
    _warn_at(transform, f"{named} returned the {mask_key!r} leaf changed (given: the pad mask, "
             f"bool of shape {given.shape}, False on the rows that pad a batch; returned: "
             f"{out.dtype} of shape {np.shape(out)}), so it no longer tells records from "
             "padding: a map of the whole batch changes it too (leave it out: {k: v if "
             f"k == {mask_key!r} else f(v) for k, v in batch.items()}}), or a mask or weights "
             f"of the transform's own took its key (name those otherwise, or pass "
             f"mask_key='pad_mask' to the loader)")


def _shape(leaf: Any) -> tuple | None:
    """A leaf's shape as NumPy sees it (a Python number's: ``()``), ``None`` where it has none
    (a list of rows of other lengths)."""
    try:
        return np.shape(leaf)
    except ValueError:
        return None


def finish_batch(treedef: tree_lib.TreeDef, columns: list, batch_transforms: tuple, size: int,
                 where: Callable[[], str], alloc: Callable[[int], Any] | None = None,
                 clock: StageClock | None = None, keyed: tuple = (0, 0, None),
                 mask_key: str | None = None, compiles: StageClock | None = None
                 ) -> tuple[Any, collate.Layout]:
    """The batch of ``columns`` after the ``BatchMap``s and ``JitMap``s, written into
    ``alloc`` when given; ``where()`` names it in an error; ``keyed``: ``(seed, epoch,
    positions)`` of its records, a ``JitMap``'s keys; ``mask_key``: the pad mask's leaf,
    which a transform that leaves it out is warned of. Each transform's seconds go to
    ``clock`` under its name, taken off its collation (which the caller times whole); a
    ``JitMap``'s compilation to ``compiles`` (the maker's clock, on every batch: a partial
    last batch's new shape compiles on a batch not timed)."""
    if not columns or len(columns) == 1 and columns[0].path == f"[{mask_key!r}]":  # (none
        # but a pad mask, if any: a batch of nothing, given to the step without a word)
        shown = tree_lib.unflatten(treedef, [None] * len(columns))  # (the mask's leaf: left
        if isinstance(shown, dict) and columns:  # out of what is shown, as it was made here)
            shown = {k: v for k, v in shown.items() if k != mask_key}
        raise RecordError(f"{where()}: its records have no leaves ({shown!r}): the source or "
                          "a Map returned an empty record; return the arrays a step needs (a "
                          "dict of them)")
    if not batch_transforms:
        return collate.materialize(treedef, columns, alloc)
    seed, epoch, positions = keyed
    last, loaders = len(batch_transforms) - 1, None  # (the loader's pad mask, as made)
    made: list = []  # the arrays the loader made (not copied again where a transform keeps one)
    batch: Any = None  # (a JitMap first reads the columns itself, a chunk of rows at a time)
    for i, t in enumerate(batch_transforms):
        start = perf_counter()
        layout, outside, compiled_s, again = None, 0.0, 0.0, None
        if type(t) is JitMap:  # (its errors name the batch, the transform and the remedy)
            if batch is not None:
                treedef, columns = batch_columns(batch, size)
            given = _mask_of(mask_key, None, columns)
            held = _held(given)
            keys = dict(seed=seed, epoch=epoch, index=i, where=where,
                        positions=np.arange(size) if positions is None else positions)
            batch, layout, outside, compiled_s = t.run(
                treedef, columns, size, alloc=alloc if i == last else None, **keys)
            made += tree_lib.flatten(batch)[0]
            if given is not None and not _said(t, mask_key) and not given.all():
                records = [c._replace(values=np.ones_like(given)) if c.values is given else c
                           for c in columns]  # (every row a record: made alike, mask unused)
                again = lambda: t.run(treedef, records, size, **keys)[0]  # noqa: E731
        else:
            if batch is None:
                batch = collate.materialize(treedef, columns)[0]
                made += tree_lib.flatten(batch)[0]
            elif i and type(batch_transforms[i - 1]) is JitMap:  # (a batch of one chunk is
                batch = _writable(batch)  # XLA's, read-only; of several, the loader's arrays)
                made += tree_lib.flatten(batch)[0]
            given = _mask_of(mask_key, batch, [])  # (a mask carried in a tuple: not warned)
            held = _held(given)  # (as given: the transform may write into it)
            if mask_key is not None and isinstance(given, np.ndarray) and \
                    not _said(t, mask_key) and not given.all():
                # (a padded batch, the transform not yet found to keep or drop the mask: a
                # copy to make again with every row a record, which it may write into; a mask
                # a transform before made a list: kept)
                copied = _copied(batch, mask_key, given)
                again = lambda: t.fn(copied)  # noqa: E731
            try:
                batch = batch_call(t, batch)  # (watched for draws on its first batches)
            except Exception as e:
                raise RecordError(f"{where()}: {t!r} raised {type(e).__name__}: {e}"
                                  f"{read_only_hint(e)}{keys_hint(e, batch, 'batch')}; the "
                                  "original error is the cause below") from e
            batch_said(t)
            # the transform that changed the batch axis named (the batch's check, after all of
            # them, names none); a 0-d leaf another transform may take up is left to it
            leaves, treedef = tree_lib.flatten(batch)
            rows = [(k, shape) for k, x in enumerate(leaves) if (shape := _shape(x)) is not None]
            bad = next(((k, shape) for k, shape in rows if (
                shape[0] != size if shape else i == last)), None)
            if bad is not None:
                path = tree_lib.leaf_paths(treedef)[bad[0]]
                raise RecordError(
                    f"{where()}: {t!r} returned a leaf of shape {bad[1]} at {path or '<root>'},"
                    f" expected {size} rows first (the batch's): a batch transform keeps the "
                    "batch axis" + (" (a list or tuple in a batch is a node, each item a leaf "
                                    "of its own: return an array, np.asarray(a_list) for text)"
                                    if path.endswith("]") and path.rsplit("[", 1)[-1][:-1]
                                    .isdigit() else "") + "; to drop rows use a FilteredSource, "
                    "for several examples a record return them stacked from a Map "
                    "(docs/troubleshooting.md, 'Several examples from one record')")
        if clock is not None:  # (a timed batch; a JitMap's compilation timed apart, once)
            spent = perf_counter() - start - outside - compiled_s
            clock.add_sampled(stage_name(t), spent)
            clock.add_sampled(COLLATE, -spent - compiled_s)
        if compiled_s and (compiles or clock) is not None:
            cast(StageClock, compiles or clock).add(stage_name(t) + COMPILED, compiled_s)
        if batch is None:
            raise returned_none(where(), t)
        if not tree_lib.flatten(batch)[0]:
            raise RecordError(f"{where()}: {t!r} returned a batch of no leaves ({batch!r}); "
                              "return the arrays a step needs (a dict of them)")
        kept = mask_key is not None and isinstance(batch, Mapping) and mask_key in batch
        if loaders is None and isinstance(held, np.ndarray) and held.dtype == bool:
            loaders = held  # (the loader's, as the first transform got it: each after is
        if kept and loaders is not None and not _said(  # held to it, as it may cast it)
                t, ("changed", mask_key)) and not _same_mask(batch[mask_key], loaders) and \
                not _passed_on(batch[mask_key], held):  # (one after it is not to blame)
            _say(t, ("changed", mask_key))  # (once a transform: a changed one, not the next)
            _changed_mask(t, cast(str, mask_key), loaders, batch[mask_key])
        if again is not None:  # (a padded batch: found once, not looked for again)
            _say(t, mask_key)
            if not kept and not any(_is_mask(leaf, given) for leaf in tree_lib.flatten(batch)[0]):
                alike, batch = _made_again(batch, again)
                if alike:
                    _dropped_mask(t, cast(str, mask_key))
        if not kept:
            mask_key = None
        if layout is not None:  # a JitMap wrote it into alloc
            return batch, layout
    treedef, columns = batch_columns(batch, size, owned=made)  # (a transform's own: copied)
    return collate.materialize(treedef, columns, alloc)


def _writable(batch: Any) -> Any:
    """``batch`` with its read-only arrays copied: a ``BatchMap`` writing into what a
    ``JitMap`` gave it failed on a batch of one chunk alone (the last, partial one, hours in)."""
    leaves, treedef = tree_lib.flatten(batch)
    if all(not isinstance(x, np.ndarray) or x.flags.writeable for x in leaves):
        return batch
    return tree_lib.unflatten(treedef, [x.copy() if isinstance(x, np.ndarray) and
                                        not x.flags.writeable else x for x in leaves])
