"""Argument checks shared by the loader, the sampler and the state: one wording everywhere.

Example:
    >>> check_int("num_workers", 2, low=0, remedy="0 runs in this process")
    2
    >>> check_int("num_workers", -1, low=0, remedy="0 runs in this process")
    Traceback (most recent call last):
    ...
    jaxloader.base.errors.ConfigError: num_workers: expected an int >= 0, got -1; 0 runs in this process
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import operator
import re
import reprlib
from typing import Any, Callable, SupportsIndex, Union

import numpy as np

from jaxloader.base.errors import ArgumentError, ConfigError, StateDictError

MASK64 = (1 << 64) - 1  # seeds and hash keys are 64-bit
Int = Union[int, np.integer, SupportsIndex]  # a count or a seed as a user's code has it
# (NumPy's, and a JAX or NumPy 0-d integer array: both have __index__; check_int makes an int)
# A record's random numbers are keyed by (epoch << POSITION_BITS | position) in 64 bits
# (transforms.RecordRng): positions < 2**40 (1e12 records), epochs < 2**24 (EPOCH_LIMIT)
POSITION_BITS = 40
EPOCH_LIMIT = 1 << (64 - POSITION_BITS)
# A count, size or step past int64's largest (sys.maxsize, which may mean "no bound") is a
# typo: refused by check_int where it is given, not as a bare overflow or a hang later
INT_LIMIT = (1 << 63) - 1
BATCH_LIMIT = 1 << 31  # a batch's records: its rows are arrays of them, made at the start


def past_epochs(step: int, epoch: int) -> ConfigError:
    """The error for step ``step``, in epoch ``epoch`` >= ``EPOCH_LIMIT``."""
    return ConfigError(
        f"step {step:,} is in epoch {epoch:,}: epochs stop at {EPOCH_LIMIT:,} (a record's "
        "random numbers are keyed by its epoch and position in 64 bits, and its state could "
        "not be restored); make an epoch longer (ConcatSource([source] * k) holds k passes "
        "over it an epoch)")


def check_positions(positions: int, random: bool) -> None:
    """Refuses epochs of more than 2**POSITION_BITS record positions where a transform draws
    random numbers: past it, a record's key would share its bits with the epoch's."""
    if random and positions > 1 << POSITION_BITS:
        raise ConfigError(
            f"an epoch of {positions:,} record positions with a RandomMap or JitMap: a "
            f"record's random numbers are keyed by its position in {POSITION_BITS} bits "
            f"({1 << POSITION_BITS:,} positions an epoch); read a part of the source at a "
            "time (FilteredSource(source, indices=part)), or draw the numbers in a Map from "
            "the record's own fields")


def check_int(name: str, value: object, *, low: int, high: int | None = None, remedy: str,
              error: type[Exception] = ConfigError) -> int:
    """``value`` as an int if it is one (not a bool) in ``[low, high]`` (``high`` None:
    ``INT_LIMIT``, int64's largest); else ``error`` naming ``name``, what was expected, what
    came, and ``remedy``. An argument's 0-d integer array (a JAX scalar, ``jnp.int32(3)``, or
    NumPy's) is its int, as ``range()`` takes it; a state's values (``StateDictError``) are
    checked as they are used, Python's or NumPy's ints.

    Example:
        >>> check_int("seed", np.array(7, np.uint32), low=0, remedy="a seed")
        7
    """
    if error is ConfigError:
        value = scalar_int(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise error(f"{name}: expected an int, got {type(value).__name__} {value!r}; {remedy}")
    if value < low or value > (INT_LIMIT if high is None else high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}" if value < low \
            else f"<= 2**63 - 1 ({INT_LIMIT:,}, sys.maxsize)"
        raise error(f"{name}: expected an int {bound}, got {value}; {remedy}")
    return int(value)


def scalar_int(value: object) -> object:
    """The int an integer that is not Python's nor NumPy's holds (a 0-d array, JAX's
    ``jnp.int32(3)`` or NumPy's, anything of ``__index__``: the ``Int`` type), else ``value``
    as it is (an int, NumPy's, or what its check refuses: a bool array, a 1-d one).

    Example:
        >>> scalar_int(np.array(3)), scalar_int(np.int8(3)), scalar_int(np.array([3]))
        (3, np.int8(3), array([3]))
    """
    if isinstance(value, (int, np.integer)) or not hasattr(type(value), "__index__") or (
            getattr(getattr(value, "dtype", None), "kind", "") == "b"):
        return value
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:  # (a 1-d array of one value, a float array: refused as they are)
        return value


def is_seconds(value: object) -> bool:
    """Whether ``value`` is a number of seconds > 0 (NumPy's too; not a bool, nor infinity).

    Example:
        >>> is_seconds(np.float32(30)), is_seconds(True), is_seconds(float("inf"))
        (True, False, False)
    """
    return bool(isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)) and 0 < value < math.inf)


def check_bool(name: str, value: object) -> bool:
    """``value`` as a bool if it is one (NumPy's too, and the ints 0 and 1); else
    ``ConfigError`` naming ``name`` (a string such as ``"no"`` is true to Python, and was
    taken as ``True``).

    Example:
        >>> check_bool("Stream(shuffle_shards)", np.bool_(False)), check_bool("x", 1)
        (False, True)
    """
    if not isinstance(value, (bool, np.bool_)) and not (
            isinstance(value, (int, np.integer)) and value in (0, 1)):
        raise ConfigError(f"{name}: expected True or False, got {type(value).__name__} "
                          f"{value!r:.80}; pass a bool (a string such as 'no' is true)")
    return bool(value)


def record_index(index: object, size: int, owner: str) -> int:
    """``index`` as the int position of one of ``owner``'s ``size`` records (an int of any
    kind: NumPy's, a 0-d array; ``-1`` the last, as a list's). A float
    (``source[len(source) / 2]``, read as another record by a cut) or a str raises a
    ``TypeError`` naming ``owner``; a position out of range an ``IndexError``.

    Example:
        >>> record_index(np.int64(3), 10, "ParquetSource"), record_index(-1, 10, "S")
        (3, 9)
        >>> record_index(2.5, 10, "S")
        Traceback (most recent call last):
        ...
        TypeError: S[2.5]: expected an int in [-10, 10), got float; pass an int: source[int(i)]
    """
    at = scalar_int(index)
    if isinstance(at, bool) or not isinstance(at, (int, np.integer)):  # (True: record 1)
        raise TypeError(f"{owner}[{index!r:.40}]: expected an int in [-{size}, {size}), got "
                        f"{type(index).__name__}; pass an int: source[int(i)]")
    at = int(at)
    if -size <= at < 0:
        return at + size
    if not 0 <= at < size:
        raise IndexError(f"{owner}: index {at} out of range [0, {size}) (or [-{size}, -1] from "
                         "the end)")
    return at


def check_indices(indices: np.ndarray, size: int, owner: str) -> None:
    """Raises ``IndexError`` naming ``owner``, the first index out of ``[0, size)`` and the
    range, as ``owner[index]`` does (one vectorised test: a batched read's).

    Example:
        >>> check_indices(np.array([3, 12, 1]), 10, "ParquetSource")
        Traceback (most recent call last):
        ...
        IndexError: ParquetSource: index 12 out of range [0, 10)
    """
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= size):
        bad = int(indices[(indices < 0) | (indices >= size)][0])
        raise IndexError(f"{owner}: index {bad} out of range [0, {size})")


def int_indices(indices: Any, size: int, owner: str) -> np.ndarray:
    """``indices`` (a user's ``__getitems__`` argument) as int64 positions of ``owner``'s
    ``size`` records, as ``check_indices`` checks them: an array of floats (cut to other
    records) or of bools (a mask read as positions 0 and 1) raises a ``TypeError``; a uint64
    past int64 an ``IndexError`` naming it as given (not wrapped negative).

    Example:
        >>> int_indices([2, 0], 3, "S").tolist()
        [2, 0]
        >>> int_indices(np.array([1.7]), 3, "S")
        Traceback (most recent call last):
        ...
        TypeError: S.__getitems__: expected int positions, got an array of float64 (1.7); \
pass ints (np.asarray(indices, np.int64) of whole numbers)
    """
    given = np.asarray(indices)
    if given.size and given.dtype.kind not in "iu":
        raise TypeError(f"{owner}.__getitems__: expected int positions, got an array of "
                        f"{given.dtype} ({', '.join(map(repr, given.ravel()[:4].tolist()))}"
                        f"{', ...' if given.size > 4 else ''}); pass ints (np.asarray(indices, "
                        "np.int64) of whole numbers)")
    if given.dtype.kind == "u" and given.size and int(given.max()) >= size:
        raise IndexError(f"{owner}: index {int(given.max())} out of range [0, {size})")
    out = given.astype(np.int64, copy=False).reshape(-1)
    check_indices(out, size, owner)
    return out


def refused_call(fn: Callable[..., Any], *args: Any) -> str | None:
    """``fn``'s signature where a call with ``args`` would not bind to it (a user's function
    of the wrong arity, named before a worker or a stream calls it), else ``None``; ``None``
    too where it has no signature to read (a builtin).

    Example:
        >>> refused_call(lambda: 0, 1), refused_call(lambda shard: 0, 1)
        ('()', None)
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args)
    except TypeError:
        return str(signature)
    return None


def check_one_argument(label: str, fn: Callable[..., Any], called: str = "fn(record)") -> None:
    """Refuses ``fn`` that a call with one argument would not bind to (``lambda r, rng: ...``:
    it failed at the first record, in a worker), naming ``label`` and how it is ``called``.

    Example:
        >>> check_one_argument("Stream.map(fn)", lambda r: r)
    """
    signature = refused_call(fn, None)
    if signature is not None:
        raise ConfigError(f"{label}: it is called as {called}, but {callable_name(fn)}"
                          f"{signature} cannot be; pass a function of one argument (a "
                          "record's parts unpacked in it: image, label = record)")


def check_keywords(owner: str, given: dict[str, Any], takes: tuple[str, ...]) -> dict[str, Any]:
    """``given`` (a method's ``**kwargs`` it hands on) if it names only ``takes``; else an
    ``ArgumentError`` naming ``owner``, not the callee that Python's own error would name.

    Example:
        >>> check_keywords("f", {"seed": 1}, ("seed",))
        {'seed': 1}
        >>> check_keywords("f", {"sed": 1}, ("seed",))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxloader.base.errors.ArgumentError: f() got ... 'sed' (did you mean seed=?); it takes seed=
    """
    for name in given:
        if name not in takes:
            close = difflib.get_close_matches(name, takes, n=1)
            raise ArgumentError(
                f"{owner}() got an unexpected keyword argument {name!r}"
                + (f" (did you mean {close[0]}=?)" if close else "")
                + "; it takes " + ", ".join(f"{t}=" for t in takes))
    return given


def released_at_least(release: str, floor: tuple[int, int, int]) -> bool:
    """Whether a package's ``release`` (its ``__version__``) is ``floor`` or later, not a
    pre-release of ``floor`` (PEP 440's forms, read by hand: ``packaging`` is no dependency);
    a form not read is taken as one that is.

    Example:
        >>> [released_at_least(v, (4, 8, 5))
        ...  for v in ("4.8.4", "4.8.5rc1", "4.8.5", "4.8.5.post1", "5.0.0.dev0", "2.21")]
        [False, False, True, True, True, False]
    """
    parts = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(.*)", release)
    if parts is None:
        return True
    numbers = tuple(int(n or 0) for n in parts.groups()[:3])
    early = re.match(r"[-_.]?(a|b|c|rc|alpha|beta|pre|preview|dev)\d*", parts.group(4))
    return numbers > floor or numbers == floor and early is None


_DEEPEST = 64  # levels of a state's nesting, at most (a mixture of mixed streams' is ~10)


def check_bounded(state: Any, loader: str) -> None:
    """Refuses a state nested deeper than any loader writes, naming its key: a damaged or
    crafted one's checks and messages (which recurse) raised ``RecursionError``, not a
    ``StateDictError`` a caller falls back from.

    Example:
        >>> check_bounded({"step": 3, "stream": {"readers": [[0, 1]]}}, "StreamLoader")
    """
    ahead = [(value, 1, key) for key, value in state.items()] if isinstance(state, dict) else []
    while ahead:
        value, depth, key = ahead.pop()
        if depth > _DEEPEST:
            raise StateDictError(
                f"state[{str(key)[:60]!r}]: nested deeper than {_DEEPEST} levels, which no "
                f"{loader}.state_dict() writes: a damaged or edited state; pass the dict that "
                f"{loader}.state_dict() returned, unchanged")
        if isinstance(value, dict):
            ahead.extend((v, depth + 1, key) for v in value.values())
        elif isinstance(value, (list, tuple)):
            ahead.extend((v, depth + 1, key) for v in value if isinstance(v, (dict, list, tuple)))


def refuse_arrays(value: Any, where: str) -> None:
    """Refuses a NumPy array where a state holds lists (a pytree restore makes them arrays):
    compared, it raised NumPy's "truth value of an array is ambiguous", not a state's error."""
    ahead = [(value, where)]
    while ahead:
        value, where = ahead.pop()
        if isinstance(value, np.ndarray) and value.ndim:
            raise StateDictError(
                f"{where}: expected a list, received a NumPy array of shape {value.shape} (a "
                "restore that made the state's lists arrays); restore the loader's state as "
                "JSON (jaxloader.checkpoint's items), or pass the dict that state_dict() "
                "returned, unchanged")
        if isinstance(value, dict):
            ahead += [(v, f"{where}[{k!r}]") for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            ahead += [(v, f"{where}[{i}]") for i, v in enumerate(value)]


def shown_names(names: list[str]) -> str:
    """Names as a message lists them: the first 20, then how many more (10**6 keys made a
    message of 11 MB).

    Example:
        >>> shown_names(["a", "b"]), shown_names([str(i) for i in range(22)])[-11:]
        ("['a', 'b']", ' and 2 more')
    """
    return repr(names) if len(names) <= 20 else f"{names[:20]!r:.2000} and {len(names) - 20:,} more"


_BRIEF = reprlib.Repr()
_BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlevel = 40, 40, 2
_BRIEF.maxdict = _BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxset = _BRIEF.maxarray = 4
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def callable_name(fn: Any) -> str:
    """A function's name for messages: its qualified name; a ``functools.partial``'s
    function's, its arguments cut short; a callable object's ``repr`` where it names no
    address (else its class's name), on one line, cut short. (A partial's ``repr`` held its
    arguments whole, a vocabulary of 5,000 words a warning of 58,000 characters, and
    addresses that change each run.)

    Example:
        >>> import functools
        >>> callable_name(functools.partial(max, key={i: i for i in range(9)}))
        'partial(max, key={0: 0, 1: 1, 2: 2, 3: 3, ...})'
    """
    if isinstance(fn, functools.partial):
        args = [brief_value(a) for a in fn.args] + [f"{k}={brief_value(v)}"
                                                    for k, v in fn.keywords.items()]
        return f"partial({', '.join([callable_name(fn.func), *args])})"
    name = getattr(fn, "__qualname__", None)
    if isinstance(name, str):
        return name
    try:
        text = " ".join(repr(fn).split())
    except Exception:  # noqa: BLE001 - (a repr that raises: its class's name)
        text = ""
    return text if text and not _ADDRESS.search(text) and len(text) <= 120 else \
        f"{type(fn).__qualname__} object" if not text or _ADDRESS.search(text) else \
        text[:117] + "..."


def source_said(source: Any) -> str:
    """A source as a ``repr`` shows it, cut short: a list or tuple of records by its first
    few and its length (its whole ``repr``, made and then cut, took 31 s for 200,000 records).

    Example:
        >>> source_said([{"x": i} for i in range(10_000)])
        "[{'x': 0}, {'x': 1}, {'x': 2}, {'x': 3}, ...] (10,000 records)"
    """
    if type(source) in (list, tuple):
        return f"{brief_value(source)} ({len(source):,} records)"
    said = repr(source)
    return said if len(said) <= 120 else f"{said[:100]}... ({len(source):,} records)"


def brief_value(value: Any) -> str:
    """``value`` as a message shows it: a callable by its name, a container by its first few
    items, on one line, without addresses (``reprlib``)."""
    if callable(value) and isinstance(getattr(value, "__qualname__", None), str):
        return value.__qualname__
    return _ADDRESS.sub("", " ".join(_BRIEF.repr(value).split()))
