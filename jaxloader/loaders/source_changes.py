"""What a state's check says of a source whose fingerprint differs from the state's: the
fingerprints (``kind:records:digest``, ``sources.fingerprint``) tell what may have changed.

Example:
    >>> print(source_differences("filtered:200:ab", "filtered:200:cd")[0][:72])
    the source is of the same kind (filtered) and size, so what differs is i
"""

from __future__ import annotations


def source_differences(then: str, now: str) -> list[str]:
    """What differs between the saved source's fingerprint ``then`` and this one's ``now``,
    said as the state's check lists it (none where they are the same, or say nothing)."""
    if then != now and then.split(":")[:2] == now.split(":")[:2]:
        kind = now.split(":")[0]
        kept = ("the records it keeps (another subset of the same size, or the same in another "
                "order: keep a round's indices beside the checkpoint and make the "
                "FilteredSource from them), " if kind == "filtered" else "")
        return [f"the source is of the same kind ({kind}) and size, so what differs is inside "
                f"it: {kept}a function it runs (MapSource, a filter's predicate: its code as "
                "this Python compiles it: another Python or -O differs too), its options (a "
                "ParquetSource's columns=, in their order), or its data; or the state is older "
                "than a change of that source's fingerprint (the checkpointing guide lists "
                "them): restore with the jaxloader that saved it"]
    if then != now and ":" not in then + now and "None" not in (then, now):  # (its own)
        return ["the source's own fingerprint differs (its `fingerprint` attribute; a Hugging "
                "Face Dataset's, which map, filter, with_format, select, flatten_indices and "
                "save_to_disk + load_from_disk change, and a map whose function datasets cannot "
                "hash makes anew each run: pass it new_fingerprint=): make the source the same "
                "way as the run that saved the state"]
    return []
