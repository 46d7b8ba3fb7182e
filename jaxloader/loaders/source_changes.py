"""What a state's check says of a source whose fingerprint differs from the state's: the
fingerprints (``kind:records:digest``, ``sources.fingerprint``) tell what may have changed.

Example:
    >>> print(source_differences("filtered:200:ab", "filtered:200:cd")[0][:72])
    the source is of the same kind (filtered) and size, so what differs is i
    >>> print(source_differences("mixture:3:ab", "mixture:4:cd")[0][:62])
    the mixture's components: 3 then, 4 now; to mix a component in
"""

from __future__ import annotations

from typing import Callable, Sequence


def changed_parts(then: object, now: object, name: Callable[[int], str] | None) -> list[str]:
    """The parts (of a ``ConcatSource`` or a mixture) whose fingerprints differ between the
    state's ``"parts"`` and this source's, as ``name`` names them (five, then how many more):
    none where either has none (a state saved before 2026-12-03) or their counts differ.

    Example:
        >>> changed_parts(["ab", "cd", "ef"], ["ab", "00", "ef"], lambda i: f"mix(sources)[{i}]")
        ['mix(sources)[1]']
    """
    if not (isinstance(then, list) and isinstance(now, list)) or len(then) != len(now):
        return []
    changed = [i for i, (a, b) in enumerate(zip(then, now)) if a != b]
    more = [f"{len(changed) - 5} more"] if len(changed) > 5 else []
    return [name(i) if name else f"part {i}" for i in changed[:5]] + more


def source_differences(then: str, now: str, same_size: bool = True,
                       changed: Sequence[str] = ()) -> list[str]:
    """What differs between the saved source's fingerprint ``then`` and this one's ``now``,
    said as the state's check lists it (none where they are the same, or say nothing).
    ``same_size``: whether the records counted are (a mixture's fingerprint counts its
    components, not its records); ``changed``: the parts that differ (``changed_parts``)."""
    kind, parts = now.split(":")[0], (then.split(":")[1:2], now.split(":")[1:2])
    if then != now and kind == "mixture" and then.split(":")[0] == kind:
        if parts[0] != parts[1]:
            return [f"the mixture's components: {parts[0][0]} then, {parts[1][0]} now; to mix "
                    "a component in later, mix it from the start at weight 0 and raise it "
                    "with jl.mix(..., from_step={step: weights}) (one taken out: keep it, at "
                    "weight 0 from the step)"]
        one = (f"{', '.join(changed)} {'differ' if len(changed) > 1 else 'differs'}"
               if changed else "one of them differs")
        return [f"the mixture holds its {parts[1][0]} components, but {one} "
                "inside: " + ("its records (as many as then, other values)" if same_size else
                              "its records (num_records: appended or removed)")
                + ", a function it runs (MapSource, a filter's predicate) or its options; or "
                "the same components in another order (a list or dict built otherwise: pass "
                "them in the saved run's order)"]
    if then != now and then.split(":")[:2] == now.split(":")[:2]:
        kept = ("the records it keeps (another subset of the same size, or the same in another "
                "order: keep a round's indices beside the checkpoint and make the "
                "FilteredSource from them), " if kind == "filtered" else
                "its packing (a PackedSource's length, method, seed, keys, overlong, bins, "
                "window or value: each as the saved run's), " if kind == "packed" else "")
        where = f" (its {'parts' if len(changed) > 1 else 'part'} {', '.join(changed)})" \
            if changed else ""
        return [f"the source is of the same kind ({kind}) and size, so what differs is inside "
                f"it{where}: {kept}a function it runs (MapSource, a filter's predicate: its code "
                "as this Python compiles it: another Python or -O differs too; a MapSource's "
                "records as mapped: what its function reads beyond its code, a module's "
                "vocabulary built from a set, whose order differs in each process: build it "
                "from sorted(set(...))), its options (a "
                "ParquetSource's columns=, in their order), or its data; or the state is older "
                "than a change of that source's fingerprint (the checkpointing guide lists "
                "them): restore with the jaxloader that saved it"]
    if then != now and ":" not in then + now and "None" not in (then, now):  # (its own)
        return ["the source's own fingerprint differs (its `fingerprint` attribute; a Hugging "
                "Face Dataset's, which map, filter, with_format, select, flatten_indices and "
                "save_to_disk + load_from_disk change, and a map whose function datasets cannot "
                "hash makes anew each run: pass it new_fingerprint=; a fingerprint of from_dict "
                "or a map, which datasets takes from pickles, differs under another Python "
                "version: restore under the one that saved the state): make the source the "
                "same way as the run that saved the state"]
    return []


def moved(then: object, now: object, name: Callable[[int], str]) -> str | None:
    """Where the state's ``then`` and this source's ``now`` (its files' identities, its
    parts' fingerprints) are the same in another order: the saved order, each named as
    ``name`` names now's (five, then how many more); else ``None``.

    Example:
        >>> moved(["b", "a", "c"], ["a", "b", "c"], lambda i: f"part-{i}")
        'part-1, part-0, part-2'
    """
    if not (isinstance(then, list) and isinstance(now, list)) or then == now or sorted(
            map(str, then)) != sorted(map(str, now)):
        return None
    at: dict[str, list[int]] = {}
    for i, item in enumerate(map(str, now)):
        at.setdefault(item, []).append(i)
    order = [at[item].pop(0) for item in map(str, then)]
    return ", ".join(name(i) for i in order[:5]) + (f" and {len(order) - 5} more"
                                                     if len(order) > 5 else "")


def reordered(then: object, now: object) -> list[str]:
    """A note where two record specs (``record_spec``: ``"['a']: int64(); ..."``) hold the
    same leaves in another order: a frame's columns selected in another order, whose records
    are the same dicts, though their fingerprint differs.

    Example:
        >>> reordered("['a']: int64(); ['b']: f()", "['b']: f(); ['a']: int64()")[0][:43]
        "the records' leaves are the same in another"
    """
    if not (isinstance(then, str) and isinstance(now, str)) or then == now:
        return []
    saved, given = then.split("; "), now.split("; ")
    if sorted(saved) != sorted(given):
        return []
    paths = [item.split(": ", 1)[0] for item in saved]
    names = [p[2:-2] for p in paths if p.startswith("['") and p.endswith("']")]
    frame = f" (a frame: df[{names!r}])" if len(names) == len(paths) else ""
    return [f"the records' leaves are the same in another order: give them in the order saved, "
            f"{', '.join(paths)}{frame}"]
