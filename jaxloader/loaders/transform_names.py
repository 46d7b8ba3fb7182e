"""The loader's transforms as its state and the processes of a run name them: each one's
``repr`` and a digest of its function's code and of the arrays that function holds
(``transforms_of``, and the forms older versions wrote); what the processes compare
(``compared_transforms``: kinds and digests, where a ``repr`` may hold an address; a ``Pad``'s
settings exactly, ``exact_settings``); and the warnings where a restore's transforms or
generators differ from the saved run's.

Example:
    >>> from jaxloader.batching.pad import Pad
    >>> compared_transforms(transforms_of([Pad("t", length=5)]))
    ["Pad Pad('t', value=0, length=5, length_suffix='_length')"]
"""

from __future__ import annotations

import hashlib
import itertools
import re
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from jaxloader.base.difference import differ
from jaxloader.base.errors import JaxloaderWarning, StateDictError, user_stacklevel
from jaxloader.sources.array_digest import arrays_digest
from jaxloader.sources.code_digest import OLDER_FORMS, code_digest
from jaxloader.sources.parts import walk


def transforms_of(transforms: Sequence[Any]) -> list[str]:
    """Each of a loader's transforms as its state names it, its ``repr`` and a digest of its
    function's code (``code_digest``): a restore under other transforms is told.

    Example:
        >>> from jaxloader.batching.transforms import Map
        >>> transforms_of([Map(abs)])[0].startswith("Map(abs) ")
        True
    """
    return [f"{t!r} {_digest(t)}" for t in transforms]


def older_transforms_of(transforms: Sequence[Any]) -> list[list[str]]:
    """``transforms_of`` as older versions named them (``code_digest.OLDER_FORMS``): until
    2026-12-04, a bound method's object whole, also what its code does not read (each form
    below too); until 2026-12-02's 45th session, a notebook's class by its ``__call__``'s
    names alone; until 2026-12-01's 40th, also the code's names and constants in each
    Python's order; in
    2026-11-30's 34th, also a long value's text cut at 200 characters; in its 33rd, sets in
    their run's order too; before, no defaults either; before that day, the code's digest
    alone."""
    forms = [{"whole_owner": True}] + [{**form, "methods": False, "whole_owner": True}
                                       for form in OLDER_FORMS]
    return [[f"{t!r} {_digest(t, **f)}" for t in transforms] for f in forms] + [
        [f"{t!r} {code_digest(t.fn, bound=True, **forms[-1])[:16]}" for t in transforms]]


def _digest(transform: Any, **older: bool) -> str:
    """A digest of ``transform``'s code, of the settings that change what it makes (a
    ``JitMap`` given ``random=`` against what its function's signature says: its ``repr``)
    and of the bytes of the arrays its function holds (``arrays_digest``); never its code's
    alone, which older states hold (``older_transforms_of``)."""
    more = f"{code_digest(transform.fn, bound=True, **older)[:16]} "
    more += f"{getattr(transform, 'settings', '')} {arrays_digest(transform.fn)}"
    return hashlib.sha256(more.encode()).hexdigest()[:16]


def _kind_and_digest(named: str) -> tuple[str, str]:
    """A transform as ``transforms_of`` names it, less its ``repr``'s details: its kind
    (``Map``, ``BatchMap``...) and its code's digest; a ``Pad`` by its ``repr`` (its settings:
    its code is jaxloader's, another in another version, and its repr holds no address), its
    whole values as ints (a config's ``0.0`` or ``np.float32(0)`` pads as ``0`` does; not
    ``np.float16(0.1)``, another number than ``0.1``, nor its keys)."""
    kind, text = named.split("(", 1)[0], named.rsplit(" ", 1)[0]
    if kind != "Pad":
        return kind, named.rsplit(" ", 1)[-1]
    if (at := _VALUE.search(text)) is None:
        return kind, text
    return kind, text[:at.start(1)] + _WHOLE.sub(r"\1", _SCALAR.sub(_exact, at[1])) + text[
        at.end(1):]


_VALUE = re.compile(r", value=(.*?), (?:multiple_of|length)=")  # (its repr's value)
_SCALAR = re.compile(r"\bnp\.(\w+)\(([-+\w.]+)\)")  # np.float32(0.5) -> 0.5, where exact
_WHOLE = re.compile(r"(?<![\w.'\"])(-?\d+)\.0(?![\w.])")  # -100.0 -> -100 (not in a key)


def _exact(found: re.Match) -> str:
    """A NumPy scalar's text as the number it holds (``np.float32(0.5)``: ``0.5``), where it
    is that number (``np.float16(0.1)`` is not ``0.1``: as written; a complex one, or a name
    of NumPy's that is not a real number's type, as written)."""
    kind = getattr(np, found[1], None)
    if not (isinstance(kind, type) and issubclass(kind, (np.floating, np.integer))):
        return found[0]
    try:
        with warnings.catch_warnings():  # (an overflow's, made an error by the user's filter)
            warnings.simplefilter("ignore")
            held, written = float(kind(found[2])), float(found[2])
    except (TypeError, ValueError, OverflowError):
        return found[0]
    return found[2] if held == written or held != held and written != written else found[0]


def compared_transforms(named: list[str]) -> list[str]:
    """What of ``transforms_of``'s names the processes of a run compare: each one's kind and
    digest (its ``repr`` may hold an address, another in each process)."""
    return [" ".join(_kind_and_digest(n)) for n in named]


def exact_settings(compared: list[str], source: Any = None) -> dict[str, str]:
    """Of ``compared_transforms``, each ``Pad``'s settings, by its order among the Pads (a
    ``Map`` more on one process is a digest's difference, warned of), and each packing's in
    ``source`` (a ``PackedSource``'s ``compared_settings``, among its parts too): refused where
    the processes differ (a code digest, which may differ over the same code, is only warned
    of; a Pad's or a packing's length, another on each host, gave each a global batch of its
    own shape, and another packing seed read documents twice in a global batch)."""
    pads = [t[4:] for t in compared if t.startswith("Pad ")]
    packings = [part.compared_settings() for part in itertools.islice(walk(source), 1024)
                if callable(getattr(type(part), "compared_settings", None))]  # (a concat of
    # 50,000 parts took 0.66 s an iter(): the packings among its first parts)
    return {**{f"pads[{k}]": pad for k, pad in enumerate(pads)},
            **{f"packed[{k}].{name}": value for k, settings in enumerate(packings)
               for name, value in settings.items()}}


def warn_changed_transforms(saved: Any, now: list[str], step: int,
                            older: Callable[[], list[list[str]]] | None = None) -> None:
    """A warning naming the transforms that differ from the saved run's (a state saved
    before states held them, on 2026-11-29, has none to compare): the step still reads the
    same records in the same order, but makes them into other batches than that run would."""
    if saved is None:
        return
    if not isinstance(saved, list) or not all(isinstance(t, str) for t in saved):
        raise StateDictError(f"state['transforms']: expected a list of str, received "
                             f"{saved!r:.120}; pass the dict that state_dict() returned, unchanged")
    if list(map(_kind_and_digest, saved)) == list(map(_kind_and_digest, now)):
        return  # (alike: a repr may hold an address, another each run)
    if older is not None and any(list(map(_kind_and_digest, saved)) == list(
            map(_kind_and_digest, then)) for then in older()):
        return  # (a state saved before the digests held defaults, arrays' bytes, settings)
    changes = [differ(f"transforms[{i}]", a or "none", b or "none", ("saved", "now"), str)
               for i, (a, b) in enumerate(zip(saved + [""] * len(now), now + [""] * len(saved)))
               if _kind_and_digest(a) != _kind_and_digest(b)]
    warnings.warn(
        f"the loader's transforms differ from those of the run that saved this state, as "
        "their code shows (a lambda's whole line, the Python version's constants, python -O "
        "against a run without: an assert's), or the arrays or settings their functions hold "
        f"({'; '.join(changes[:4])}{'; ...' if len(changes) > 4 else ''}): from step {step} "
        "on, the same records in the same order are made into batches by this loader's "
        "transforms, not the saved run's; restore with the same transforms for the same "
        "batches", JaxloaderWarning, stacklevel=user_stacklevel())


def warn_changed_generators(saved: Any, now: list[str], step: int,
                            before: Callable[[], Sequence[list[str]]] = tuple) -> None:
    """A warning where the functions that make the stream's records (``Stream.from_generator``'s,
    a Hugging Face dataset's ``map``, ``filter`` and ``from_generator`` functions) differ from
    the saved run's, by their code or what their closures hold (a list of files): the restore
    would read other records. A warning, not a refusal: a closure may hold what differs each run and
    changes no record (parsed arguments, a time). Older states: none, or one of ``before()``
    (made only for a state that differs)."""
    if saved is None or saved == now or saved in before():
        return
    if not isinstance(saved, list) or not all(isinstance(c, str) for c in saved):
        raise StateDictError(f"state['generators']: expected a list of str, received "
                             f"{saved!r:.120}; pass the dict that state_dict() returned, unchanged")
    warnings.warn(
        f"the functions that make the stream's records (Stream.from_generator's; a Hugging Face "
        f"dataset's map, filter and from_generator functions) differ from those of the run "
        f"that saved this state, by their code or what their closures hold (digests: saved "
        f"{saved[:4]}, now {now[:4]}): if they make other records (other files), the stream "
        f"from step {step} is not the saved run's; restore with the same functions for the "
        "same records", JaxloaderWarning, stacklevel=user_stacklevel())
