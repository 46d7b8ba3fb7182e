"""What an array of objects in a record or a batch may hold, and the refusal of what no batch
holds, naming the leaf, the record and the conversion to make.

Example:
    >>> check_objects("['x']", "record position 0", np.array(["a", None], dtype=object))
    >>> check_objects("['x']", "record position 0", np.array([1.5, 2.0], dtype=object))
    Traceback (most recent call last):
    ...
    jaxloader.base.errors.CollateError: batch leaf ['x']: record position 0 is an array of \
Python objects holding numbers (a float first), which a batch would carry as objects: no device \
takes it, and each worker pickles it; cast it in a Map (np.asarray(x, np.float32); pandas' \
df.to_numpy() of a frame with a column of strings gives such an array: select the number \
columns first)
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from jaxloader.base.errors import CollateError


def check_objects(path: str, where: str, array: np.ndarray, by_row: bool = False) -> None:
    """Refuses an array of objects (``array``, at ``where``; ``by_row``: the value's place
    after it, a batch's column's row) whose first value that is not ``None`` is a number (one
    device dtype would hold them all), or that holds a value of a type no batch holds (a lock:
    taken in process, unpicklable by workers; a ``Decimal`` refused as a leaf of its own),
    wherever it is (each type looked at once: ~20 ns a value)."""
    row, first = next(((i, v) for i, v in enumerate(array.flat) if v is not None), (0, None))
    if isinstance(first, (bool, int, float, complex, np.number, np.bool_)):
        raise CollateError(
            f"batch leaf {path}: {f'{where} {row}' if by_row else where} is an array of "
            f"Python objects holding numbers (a {type_name(first)} first), which a batch "
            "would carry as objects: no device takes it, and each worker pickles it; cast it "
            "in a Map (np.asarray(x, np.float32); pandas' df.to_numpy() of a frame with a "
            "column of strings gives such an array: select the number columns first)")
    for kind in set(map(type, array.flat)):
        if not issubclass(kind, OBJECTS):
            row, value = next((i, v) for i, v in enumerate(array.flat) if type(v) is kind)
            if not has_array_protocol(value):
                refuse_object(path, f"{where} {row}" if by_row else where, value)


def refuse_object(path: str, where: str, value: Any) -> NoReturn:
    """The ``CollateError`` for ``value``, of a type no batch holds, at ``where``."""
    hint = ""
    if type(value).__module__ == "__main__":
        hint = (" (a class from __main__ or a notebook reaches worker processes by value, "
                "without its JAX registration: define it in a module, or use num_workers=0)")
    elif is_sparse(value):
        hint = f" ({SPARSE})"
    elif isinstance(value, (memoryview, bytearray)):  # (a buffer, no array protocol)
        hint = (" (a buffer: bytes(x) for its bytes, as a str or bytes leaf is kept, or "
                "np.frombuffer(x, dtype) for its numbers)")
    elif type(value).__qualname__ == "Decimal" and value == value.to_integral_value():
        hint = (f" ({value} is a whole number: ids written as DECIMAL(20, 0), uint64 in Hive "
                "and Spark, lose their last digits as floats; np.uint64(int(x)) or "
                "np.int64(int(x)) keeps them)")
    elif type(value).__qualname__ == "Decimal":
        hint = (f" (a decimal column's: float(x) may round {value}; str(x) keeps its digits, "
                "and int(x.scaleb(k)), an integer of k digits after the point, keeps it exact: "
                "np.int64 of it where it fits, else a string)")
    raise CollateError(
        f"batch leaf {path}: {where} holds a {type_name(value)}, which is "
        "neither an array (nor has the array protocol), a number, a string nor a pytree node; "
        "convert it in a Map to numbers (float(x), np.asarray(x) of what holds them; a "
        "datetime.time: np.timedelta64 since midnight) or a string (str(x)), or register "
        "its class as a JAX "
        f"pytree node (jax.tree_util.register_dataclass) in a module the workers can import{hint}"
    )


def is_sparse(value: Any) -> bool:
    return type(value).__module__.startswith("scipy.sparse") and hasattr(value, "toarray")


DENSE = "make it dense: x.toarray() (scikit-learn's encoders: sparse_output=False)"
SPARSE = (f"{DENSE}, or give its parts as leaves (x.indices, x.data: jl.Pad pads them to the "
           "batch's longest)")


# what an array of objects a source or a batch transform gives may hold: strings, bytes, arrays
# a row (ragged lists), dicts (a Parquet list of structs), dates; and None, left to the consumer
OBJECTS = (str, bytes, np.ndarray, np.generic, dict, list, tuple, bool, int, float, complex,
            type(None))


def has_array_protocol(value: Any) -> bool:
    return any(hasattr(value, a) for a in ("__array__", "__array_interface__",
                                           "__array_struct__"))


def type_name(value: Any) -> str:
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else \
        f"{cls.__module__}.{cls.__qualname__}"
