"""``FileListSource``: one record per file, its bytes and (optionally) a label.

For folders of images, audio clips and the like: the record is ``{"path": str, "data": bytes}``
(and ``"label"`` when labels are given), decoded by a ``Map``/``RandomMap`` (in the workers).
Remote paths (``gs://`` and the like) are opened through ``etils.epath``, as Orbax opens its
checkpoints (imported only then: it costs a worker 7 MiB); a missing or unreadable file fails at
its record, naming the path.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

import numpy as np

from jaxloader.base import file_identity
from jaxloader.base.checks import record_index
from jaxloader.base.errors import ConfigError
from jaxloader.base.loader_names import loader_names
from jaxloader.sources.paths import files_fingerprints
from jaxloader.sources.protocol import Source


@loader_names("source")
class FileListSource(Source):
    """The files at ``paths``, in that order; ``labels[i]`` (ints) labels ``paths[i]``.

    Example:
        >>> import os, tempfile, jaxloader as jl
        >>> folder = tempfile.mkdtemp()
        >>> for name in ("a.txt", "b.txt"):
        ...     with open(os.path.join(folder, name), "wb") as f:
        ...         _ = f.write(name.encode())
        >>> files = jl.FileListSource([os.path.join(folder, n) for n in ("a.txt", "b.txt")],
        ...                           labels=[0, 1])
        >>> files[1]["data"], int(files[1]["label"])
        (b'b.txt', 1)
    """

    def __init__(self, paths: Sequence[str | os.PathLike],
                 labels: Sequence[int] | np.ndarray | None = None) -> None:
        if isinstance(paths, (str, bytes, os.PathLike)):
            raise ConfigError(
                f"FileListSource(paths): expected a list of paths, got one path {paths!r}; for a "
                "folder, pass sorted(pathlib.Path(folder).glob('*.jpg')) or the like"
            )
        try:  # (bytes, as os.listdir(b".") gives a name that is not UTF-8: the str Python
            # makes of it, which names the same file and goes into a JSON state)
            self.paths = [os.fsdecode(p) for p in paths]
        except TypeError:  # (None, a number: named, with where it is)
            listed = list(paths) if isinstance(paths, Iterable) else None
            at, bad = next(((i, p) for i, p in enumerate(listed or ())
                            if not isinstance(p, (str, bytes, os.PathLike))), (None, paths))
            raise ConfigError(
                f"FileListSource(paths{'' if at is None else f'[{at}]'}): expected "
                f"{'a list of paths' if at is None else 'a path'} (str or pathlib.Path), got "
                f"{type(bad).__name__} {bad!r:.80}") from None
        if not self.paths:
            raise ConfigError("FileListSource(paths): expected at least one path, got none")
        # each local file as found from this folder, opened so (a worker started after an
        # os.chdir read the files of another folder, of the same names, without a word); a
        # record's "path" stays as given (a Map may take the class from it). Joined as read:
        # a second list of 1.28M paths doubled what each worker is sent
        try:
            self._here: str | None = os.getcwd()
        except FileNotFoundError:  # (a folder removed since: relative paths as given)
            self._here = None
        self.labels: np.ndarray | None = None
        if labels is not None:
            if not hasattr(labels, "__len__") or isinstance(labels, (str, bytes, dict)):
                raise ConfigError(f"FileListSource(labels): expected a list of ints, one a path "
                                  f"({len(self.paths)}), got {type(labels).__name__} "
                                  f"{labels!r:.80}")
            if len(labels) != len(self.paths):
                raise ConfigError(
                    f"FileListSource(labels): expected one label per path ({len(self.paths)}), "
                    f"got {len(labels)}"
                )
            given = np.asarray(labels)
            odd = None if given.dtype.kind in "iub" else next(
                (j for j, v in enumerate(labels) if not isinstance(v, (int, np.integer))), None)
            if given.dtype.kind not in "iub" and odd is None:  # ints: objects, or floats made
                big = next((j for j, v in enumerate(labels)  # of some past int64
                            if not -2**63 <= v < 2**63), None)
                if big is not None:
                    raise ConfigError(
                        f"FileListSource(labels): labels[{big}] is {int(labels[big])}, beyond "
                        "int64, which labels are kept as; pass labels from -2**63 to 2**63 - 1")
                given = np.array([int(v) for v in labels], np.int64)
            if given.dtype.kind not in "iub":
                assert odd is not None
                raise ConfigError(
                    f"FileListSource(labels): expected integers, got {given.dtype} (labels[{odd}]"
                    f" is {labels[odd]!r}); for class names pass ints, e.g. "
                    "[classes.index(name) for name in names] with classes the sorted list of "
                    "every class (sorted(os.listdir(root)) for a folder a class: the names "
                    "found in one split may lack a class, its labels then shifted)"
                    + ("; for numbers that are no class (a regression's targets), leave labels "
                       "out and look each up by its path in a Map: jl.Map(lambda r: {**r, "
                       "'target': np.float32(targets[r['path']])}), targets a dict"
                       if isinstance(labels[odd], (float, np.floating)) else ""))
            if given.dtype.kind == "u" and len(given) and given.max() >= 2**63:
                raise ConfigError(f"FileListSource(labels): {int(given.max())} is beyond int64, "
                                  "which labels are kept as; pass labels below 2**63")
            self.labels = given.astype(np.int64)

    def record_origin(self, index: int) -> str:
        """Record ``index``'s file, which an error about the record names."""
        return self.paths[index]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = record_index(index, len(self.paths), "FileListSource")
        given = path = self.paths[index]
        here = getattr(self, "_here", None)  # (a source pickled by a jaxloader before it)
        if here is not None and "://" not in path and not os.path.isabs(path):
            path = os.path.join(here, path)
        try:
            try:
                data = _read_bytes(path)
            except FileNotFoundError:  # (not on this machine: a Ray actor's node, whose
                if path == given or not os.path.exists(given):  # working_dir holds the
                    raise  # files as given, from its folder)
                data = _read_bytes(path := given)
        except OSError as e:
            if file_identity.storage_failed(e):
                raise file_identity.storage_failure("FileListSource", path,
                                                    f"record {index}", e) from e
            raise OSError(f"FileListSource: cannot read file {path!r} (record {index}): {e}" + (
                file_identity.not_on_this_node(path) if isinstance(e, FileNotFoundError) else "")
                          ) from e
        except MemoryError as e:  # (its message is empty: the file is what says why)
            raise MemoryError(f"FileListSource: file {path!r} (record {index}) does not fit "
                              "in this process's memory") from e
        record: dict[str, Any] = {"path": self.paths[index], "data": data}
        if self.labels is not None:
            record["label"] = self.labels[index]
        return record

    @property
    def fingerprint(self) -> str:
        """The files' names (``path_names``, which the same files elsewhere keep) and labels
        (reading every file would not be cheap)."""
        return self._fingerprints()[0]

    @property
    def older_fingerprints(self) -> tuple[str | None, ...]:  # (base.abilities.OLDER)
        return None, self._fingerprints()[1]  # (2026-11-28's states hold today's)

    def _fingerprints(self) -> tuple[str, str]:
        labels = () if self.labels is None else (self.labels.tobytes(),)
        return files_fingerprints("files", len(self.paths), self.paths, *labels)

    def __repr__(self) -> str:
        return f"FileListSource({len(self.paths)} files, first {self.paths[0]!r})"


def _read_bytes(path: str) -> bytes:
    with file_identity.open_binary(path) as f:  # (a FIFO or a device refused: read for good)
        return f.read()
