"""What crosses to a worker as itself rather than by its name: the functions and classes of
the script the training process runs (``__main__``, or ``__mp_main__`` in a ``multiprocessing``
spawn or forkserver child), which a worker, another program, cannot import, and their
``functools.cache`` wrappers; and the global random generators, which cross by name (each
worker draws from its own). ``payload`` pickles a local worker's payload with these, and Ray's
payload is ``dumps_by_value``'s.

Example:
    >>> import functools, json
    >>> importable(json.dumps), importable(lambda r: r)
    (True, False)
"""

from __future__ import annotations

import functools
import io
import os
import random
import sys
import types
from typing import Any, Callable

import cloudpickle
import numpy as np

from jaxloader.base.columns import from_span, overlapping, span_bytes


def global_random(name: str) -> Any:
    """This process's own global generator: Python's (``"random"``) or NumPy's legacy one
    (``"numpy"``), which a function pickled by value that names one of their bound methods
    (``from numpy.random import randint`` in a script) finds in a worker. By value, each
    worker drew from a copy of the training process's, in one state: the same numbers, each
    worker's augmentations another's, and the draws out of the global watch's sight."""
    return random._inst if name == "random" else np.random.mtrand._rand


class GlobalsByName(cloudpickle.Pickler):
    """cloudpickle's pickler, the global random generators by name (``global_random``), a
    view of overlapping elements as the bytes it spans (``span_bytes``), a function's code with
    its file's name, and a script's ``functools.cache`` functions as empty caches around it:
    a local worker's payload and a Ray actor's."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType and _CODE_REDUCE is not None and (
                obj.co_filename not in ("<string>", "<stdin>")):  # (python -c's, exec's: a
            # worker's traceback read its own -c text for them; "<python-input-3>" stays)
            rebuild, args = _CODE_REDUCE(obj)  # (cloudpickle's, which names every file
            return _named_code, (rebuild, args, obj.co_filename)  # "<dynamic-code>")
        if type(obj) is CACHED and not importable(obj):
            # rebuilt in the worker as an empty cache around the function, which crosses by
            # value; the function is set after the cache exists, so a recursive one (its
            # globals name the cache) finds the cache in the memo instead of recursing
            params = obj.cache_parameters()
            return (cache_shell, (params["maxsize"], params["typed"]), obj.__wrapped__,
                    None, None, fill_cache_shell)
        if type(obj) is memoryview:  # (pickle's refusal: cloudpickle sends its bytes, which
            raise TypeError("cannot pickle 'memoryview' object")  # the workers batched, where
            # num_workers=0 refused the memoryview itself)
        if isinstance(obj, io.TextIOWrapper) and obj not in (sys.stdin, sys.stdout, sys.stderr):
            raise TypeError(  # (cloudpickle sends a text file read whole, as a StringIO: the
                f"cannot pickle '{type(obj).__name__}' object")  # file's text when sent)
        if obj is getattr(random, "_inst", None):
            return global_random, ("random",)
        if obj is getattr(np.random.mtrand, "_rand", None):
            return global_random, ("numpy",)
        if type(obj) is np.ndarray and not obj.dtype.hasobject and overlapping(obj):
            return from_span, span_bytes(obj)  # (windows: the bytes under them, not a copy
        # (of each, which NumPy's own pickle makes)
        if isinstance(obj, types.ModuleType):  # (a function that reads cfg.SCALE: the
            renamed_by_value(obj)  # module itself crosses)
        elif isinstance(obj, (types.FunctionType, type)):
            renamed_by_value(sys.modules.get(getattr(obj, "__module__", None) or ""))
        return super().reducer_override(obj)


def renamed_by_value(module: Any) -> None:
    """Has cloudpickle send ``module`` by value where a worker's import of its name would not
    find its file: loaded under another name than the file's
    (``importlib.util.spec_from_file_location("cfg", "conf/x.py")``, as config files are
    loaded), where the remedy said, its folder on ``sys.path``, found the file by its own name
    only (the env audit); or under its file's name from a folder not on ``sys.path`` while
    another file of that name is on it (``exp/v2/augs.py`` loaded as ``augs`` beside an
    importable ``augs``: the workers ran the other file's code, without a word). Registered
    for the process's life: no other process imports it by that name."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if not isinstance(origin, str) or not origin.endswith(".py") or module.__name__ in (
            "__main__", "__mp_main__"):
        return
    name = module.__name__
    found = (name, origin, _current_folder())  # (sys.path's '' is the current folder)
    if found in _FOUND or name in cloudpickle.list_registry_pickle_by_value():
        return
    if _found_by_name(name, origin):  # (its own file, a finder's alias, a package folder of
        _FOUND.add(found)  # another name: the workers import it so; registered, the whole
        return  # process's pickles of its functions would change)
    cloudpickle.register_pickle_by_value(module)


def _current_folder() -> str | None:
    """The current folder; ``None`` where it was deleted (sys.path's '' finds nothing there)."""
    try:
        return os.getcwd()
    except OSError:
        return None


_FOUND: set[tuple[str, str, str | None]] = set()  # (name, file, folder) of the modules a finder
# finds by their name in their file, from that folder (by the name alone, another file loaded
# later under it was sent so; a notebook's module of its folder, found before it changed folder)


def _found_by_name(name: str, origin: str) -> bool:
    """Whether a finder of ``sys.meta_path`` finds module ``name`` by its name, as a worker's
    import would, in the file ``origin`` (or in none it says: setuptools' vendored aliases):
    setuptools' distutils shim, an editable install mapping a package to a folder of another
    name. Another file found by that name is not the module (a config loaded as ``config``
    beside an importable ``config``): it goes by value."""
    parent = name.rpartition(".")[0]
    path = getattr(sys.modules.get(parent), "__path__", None) if parent else None
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            spec = None if find is None else find(name, path)
        except Exception:  # noqa: BLE001 - (a finder that fails: not found by it)
            continue
        if spec is not None:
            found = getattr(spec, "origin", None)
            return found is None or os.path.realpath(found) == os.path.realpath(origin)
    return False


def script_by_value() -> None:
    """Has cloudpickle send the script a ``multiprocessing`` spawn or forkserver child runs as
    its ``__main__`` (a module named ``__mp_main__``) by value, as it sends ``__main__``'s: it
    named its functions ``__mp_main__.f``, and a worker's ``__mp_main__`` is another module
    (its own ``-c`` code: a bare ``AttributeError``, or a name of that code's taken for the
    function). Registered once, for the process's life: no other process has that script."""
    module = sys.modules.get("__mp_main__")
    if module is not None and module is sys.modules.get("__main__") and \
            "__mp_main__" not in cloudpickle.list_registry_pickle_by_value():
        cloudpickle.register_pickle_by_value(module)


def dumps_by_value(obj: Any, buffer_callback: Callable[[Any], bool]) -> bytes:
    """``cloudpickle.dumps(obj, 5, buffer_callback=...)`` (a Ray actor's payload), the global
    random generators by name."""
    script_by_value()
    buffer = io.BytesIO()
    GlobalsByName(buffer, protocol=5, buffer_callback=buffer_callback).dump(obj)
    return buffer.getvalue()


CACHED = type(functools.lru_cache()(len))  # functools._lru_cache_wrapper
# cloudpickle 3.1 ships a function's code with "<dynamic-code>" as its file: a worker's
# traceback then named no file and showed no line of a script's transform
_CODE_REDUCE = getattr(cloudpickle.cloudpickle, "_code_reduce", None)


def _named_code(rebuild: Any, args: tuple, filename: str) -> types.CodeType:
    """A function's code as cloudpickle rebuilds it, with the file it was defined in."""
    return rebuild(*args).replace(co_filename=filename)


def importable(fn: Any) -> bool:
    """Whether a worker finds ``fn`` by its module and name (not one of the script's)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "__main__")
    if module is None or module.__name__ in ("__main__", "__mp_main__"):
        return False
    found: Any = module
    for part in getattr(fn, "__qualname__", "<lambda>").split("."):
        found = getattr(found, part, None)
    return found is fn


def cache_shell(maxsize: int | None, typed: bool) -> Any:
    """An empty cache whose function ``fill_cache_shell`` sets once it is unpickled."""
    target: list = []

    def call(*args: Any, **kwargs: Any) -> Any:
        return target[0](*args, **kwargs)

    cached = functools.lru_cache(maxsize=maxsize, typed=typed)(call)
    setattr(cached, "_jaxloader_target", target)  # (a function's attribute: not in its type)
    return cached


def fill_cache_shell(cached: Any, fn: Any) -> None:
    cached._jaxloader_target.append(fn)
    functools.update_wrapper(cached, fn)
