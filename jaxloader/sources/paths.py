"""A file source's ``paths``: one path, a list, a folder or a glob pattern, as a sorted list.

A folder stands for the files under it whose names end with the source's suffix (sorted, at any
depth), a pattern (``*``, ``?``, ``[``) for the files it matches (sorted), and a folder whose
name it matches (Spark's ``train.parquet/part-*.parquet``) for that folder's files. A remote
pattern (``gs://bucket/dir/train-*.parquet``, in the file name only) lists its folder through
``etils.epath``, as Orbax lists checkpoints; a remote folder is not listed (pass a pattern). The
list is fixed at construction and is part of the source's fingerprint, so a restore over a folder
whose files changed is refused. A file listed twice (a folder and a pattern over it) is
refused: each of its records would be read twice a pass. A folder's files whose names end with
the suffix in other case (``.TAR``) are its files too; files it leaves out are warned of.

Example:
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> for name in ("b.parquet", "a.parquet", "notes.txt"):
    ...     open(os.path.join(d, name), "w").close()
    >>> [os.path.basename(p) for p in expand(d, ".parquet", "ParquetSource")]
    ['a.parquet', 'b.parquet']
    >>> [os.path.basename(p) for p in expand(os.path.join(d, "*.txt"), ".parquet", "X")]
    ['notes.txt']
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat
import warnings
from typing import Iterable, Mapping, Sequence
from urllib.parse import unquote

from jaxloader.base.errors import ConfigError, JaxloaderWarning
from jaxloader.sources.folder_walk import (PATTERN, fixed_folder, left_out, pattern_matches,
                                           walk_folders)

# a shell's brace expansion (WebDataset's shard-{000..099}.tar), which no glob expands
_BRACES = re.compile(r"\{[^{}/]*(\.\.|,)[^{}/]*\}")


def expand(paths: str | os.PathLike | Sequence[str | os.PathLike],
           suffix: str | tuple[str, ...], owner: str, *, dataset: bool = False) -> list[str]:
    """``paths`` as a list of files (local ones absolute): folders (their files ending with
    ``suffix``, or any of a tuple of them) and patterns expanded (sorted), in the order given;
    a pattern or folder with no file raises naming it. ``dataset``: a folder is read as pandas
    and pyarrow read a Parquet dataset's: names under it starting with ``_`` or ``.`` are left
    out (Spark's ``_temporary/``), and Hive partitions (``label=0/``), columns in folder
    names, refused."""
    if isinstance(paths, Mapping):  # (its keys were taken: "file 'train' does not exist")
        raise ConfigError(f"{owner}(paths): expected a path, a folder, a pattern or a list of "
                          f"them, got a {type(paths).__name__} of {list(paths)[:4]}; pass one "
                          "entry's paths (paths['train']), or a source of each")
    listed = [paths] if isinstance(paths, (str, os.PathLike)) else (
        list(paths) if isinstance(paths, Iterable) and not isinstance(paths, bytes) else [paths])
    at, bad = next(((i, p) for i, p in enumerate(listed)
                    if not isinstance(p, (str, os.PathLike))), (None, listed))
    if bad is not listed:  # (None, a number, a file object: a TypeError deep in os.fspath)
        where = "" if isinstance(paths, (str, os.PathLike)) or bad is paths else f"[{at}]"
        raise ConfigError(
            f"{owner}(paths{where}): expected a path (a str or pathlib.Path), a folder, a "
            f"pattern or a list of them, got {type(bad).__name__} {bad!r:.80}")
    out: list[str] = []
    by: list[str] = []  # (what listed each of out: a folder, a pattern, the file itself)
    left_out: list[str] = []  # a folder's files not of the suffixes (warned of)
    reals: dict[str, str] = {}  # (a folder's real path, found once: ``_real``)
    for path in [str(os.fspath(p)) for p in listed]:
        for head in ("file://localhost/", "file:///"):  # a local path (etils.epath lists no
            if path.startswith(head):  # file:// folder; a FIFO is refused); no urlsplit: a
                path = unquote("/" + path[len(head):])  # pattern's ? is no query, # no
                break  # fragment
        remote = "://" in path
        if not remote and os.path.isfile(path):  # a file named with [ or * is that file
            out.append(path)
            by.append(path)
            continue
        suffixes = (suffix,) if isinstance(suffix, str) else suffix
        if any(c in path for c in PATTERN) and (remote or not os.path.isdir(path)):
            # (a folder named with [ or ? is that folder: "run[1]" matched run1, silently)
            found = (_remote_glob(path, owner, dataset) if remote else sorted({  # a folder (a
                g for f in pattern_matches(path, owner, reals)  # Spark output's train.parquet):
                for g in (_files_in(f, suffixes, dataset, owner, left_out, reals)
                          if os.path.isdir(f)
                          else [f] if _not_folder(f, owner) else [])}))  # its files
            if not remote:
                found = _once_through_links(path, _not_hidden(path, found) if dataset else
                                            found, reals)
            what = "matches no file"
        elif not remote and os.path.isdir(path):
            found = _files_in(path, suffixes, dataset, owner, left_out, reals)
            what = f"is a folder with no *{suffixes[0]} file" + (
                f" (nor {', '.join('*' + s for s in suffixes[1:])})" if suffixes[1:] else "")
        else:  # (a file that is not there is named by its source or shard, as made)
            if not remote:
                _not_folder(path, owner)  # (a FIFO, a device: refused)
            if remote or not os.path.exists(path):
                _no_braces(path, owner)
                _not_expanded(path, owner, remote)
            out.append(path)
            by.append(path)
            continue
        if not found:
            if not os.path.isdir(path):
                _no_braces(path, owner)
                _not_expanded(path, owner, remote)
            held = [f for f in left_out if f.startswith(os.path.join(path, ""))]
            raise ConfigError(  # (a folder of TFDS's shards, x.array_record-00000-of-00002)
                f"{owner}(paths): {path!r} {what}" + (
                    f"; it holds {', '.join(repr(os.path.basename(f)) for f in held[:3])}"
                    f"{f', ... ({len(held)} files)' if len(held) > 3 else ''}: to read them, "
                    "pass a pattern that matches them (folder/*) or their paths" if held else
                    "; check the path, or pass the files' paths"))
        out.extend(found)
        by.extend([path] * len(found))
    if not out:
        raise ConfigError(f"{owner}(paths): expected at least one path, got none")
    # local files as found from this folder: a Ray actor (its own folder, another node), a
    # worker started after an os.chdir, opened another file or none ("check the path")
    here = os.getcwd()  # (joined, not normalised: "link/../x" is not "x" under a symlink)
    out = [p if "://" in p or os.path.isabs(p) else os.path.join(here, p) for p in out]
    _once_each(out, by, owner, reals)
    if left_out:
        shown = ", ".join(repr(f) for f in left_out[:3]) + (
            f", ... ({len(left_out)} in all)" if len(left_out) > 3 else "")
        warnings.warn(
            f"{owner}(paths): files in a folder given are left out, their names not ending "
            f"with {' or '.join(suffixes)}: {shown}; to read them, pass a pattern that "
            "matches them (folder/*) or their paths", JaxloaderWarning, stacklevel=3)
    return out


def _no_braces(path: str, owner: str) -> None:
    """Refuses ``path``, which names no file, where it has a shell's braces."""
    braces = _BRACES.search(path)
    if braces:
        raise ConfigError(
            f"{owner}(paths): {path!r} has braces ({braces[0]}), which are not expanded (they "
            "are a shell's, not a pattern's), and names no file; pass a pattern "
            "('shard-*.tar'), a list ([f'shard-{i:03d}.tar' for i in range(100)]) or "
            "braceexpand's list (list(braceexpand.braceexpand(path)))")


def _not_expanded(path: str, owner: str, remote: bool) -> None:
    """Refuses ``path``, which names no file, where it has a ``~`` or ``$NAME`` a shell would
    expand (a config's ``~/data``, ``$DATA/train``), which Python's ``open`` does not."""
    if not remote and (path.startswith("~") or re.search(r"\$\{?[A-Za-z_]", path)):
        raise ConfigError(
            f"{owner}(paths): {path!r} names no file; its ~ or $NAME is a shell's, not "
            "expanded: pass os.path.expandvars(os.path.expanduser(path))")


def _once_each(paths: list[str], by: list[str], owner: str, reals: dict[str, str]) -> None:
    """Refuses a file listed twice (a folder and a pattern over it, or the same path written
    two ways; ``by``: what listed each): each of its records would be read twice a pass,
    where a user means once. (Two names linked to one file are two: a link is a choice.)"""
    seen: dict[str, int] = {}
    for i, path in enumerate(paths):
        same = _real(path, reals)
        if same in seen:
            j = seen[same]
            raise ConfigError(
                f"{owner}(paths): {path!r} is listed twice, by {by[j]!r} and by {by[i]!r}: "
                "its records would be read twice a pass; list each file once (a folder and a "
                "pattern over it list its files again); to read some files more often, give "
                "them weights in jl.mix")
        seen[same] = i


def _real(path: str, folders: dict[str, str]) -> str:
    """``path`` with its folder's real path (its links followed: ``runs/latest/../x`` is where
    the link goes), its own name kept; ``folders`` keeps the real paths found (one a folder:
    50,000 files took 1.3 s)."""
    if "://" in path:
        return path
    folder = os.path.dirname(path) or os.curdir
    real = folders.get(folder) or folders.setdefault(folder, os.path.realpath(folder))
    return os.path.join(real, os.path.basename(path))


def _once_through_links(pattern: str, found: list[str], reals: dict[str, str]) -> list[str]:
    """A pattern's files, each reached through links to one folder once: by its own path where
    the pattern reaches it, no link below the pattern's fixed folder (``d/**/*.parquet`` over
    ``latest -> v2`` beside ``v2``: ``v2``'s, as a folder's walk names it, ``d`` a link or
    not; a link to ``.``: not 40 folders deep), else by the first (``current`` and ``stable``
    linked to one hidden version: ``current``'s)."""
    root = fixed_folder(pattern)[0]
    real_root = os.path.realpath(root)
    chosen: dict[str, str] = {}
    for f in found:
        same = _real(f, reals)
        own = same == os.path.normpath(os.path.join(real_root, os.path.relpath(f, root)))
        if same not in chosen or own:  # (the first, or its own path)
            chosen[same] = f
    kept = set(chosen.values())
    return [f for f in found if f in kept]


def _not_hidden(pattern: str, found: list[str]) -> list[str]:
    """A dataset pattern's files but those under a name starting with ``_`` or ``.`` below
    the pattern's fixed folder that the pattern does not name itself (``out/**/*.parquet``
    leaves a Spark job's ``out/_temporary/`` out, as a folder's listing and pyarrow's do;
    ``out/_staging*/*.parquet`` names ``_staging1``)."""
    root, matched = fixed_folder(pattern)
    named = [p for p in matched if left_out(p, True)]
    return [f for f in found if not any(
        left_out(part, True) and not any(fnmatch.fnmatchcase(part, p) for p in named)
        for part in os.path.relpath(f, root).split(os.sep))]


def _files_in(folder: str, suffixes: tuple[str, ...], dataset: bool = False,
              owner: str = "", left_out: list[str] | None = None,
              reals: dict[str, str] | None = None) -> list[str]:
    """What is under ``folder`` (at any depth) and ends with one of ``suffixes`` (in any case),
    sorted: not folders (a link to nothing stays, to be named where it is opened); for a
    ``dataset``, not under a name starting with ``_`` or ``.``, and no Hive partition (see
    ``expand``). The other files (not hidden) are added to ``left_out``."""
    ends = tuple(s.lower() for s in suffixes)
    every: list[str] = []  # (one walk: a stat a file matched, none for the others)
    others: list[str] = []
    for top, files in walk_folders(folder, dataset, owner, {} if reals is None else reals):
        for name in files:
            (every if name.lower().endswith(ends) else others).append(os.path.join(top, name))
    found = sorted(f for f in every if _not_folder(f, owner))
    if left_out is not None:
        left_out.extend(sorted(others))
    for f in found if dataset else ():  # (a Hive partition: refused, named)
        keys = [part.partition("=")[0] for part in os.path.relpath(f, folder).split(os.sep)[:-1]
                if "=" in part]
        if keys:
            raise ConfigError(
                f"{owner}(paths): {folder!r} is a Hive-partitioned folder ({f!r}): the columns "
                f"{', '.join(keys)} are in its folders' names, which {owner} does not read; "
                "write them into the files as columns, or pass the files themselves (a "
                "pattern: 'folder/**/*.parquet', which leaves names starting with _ or . out "
                "as well) to read them without those columns (a MapSource over each "
                "partition's files can add them: ConcatSource([...]))")
    return found


def _not_folder(path: str, owner: str) -> bool:
    """Whether local ``path`` is a file (or names nothing: a link to nothing is named where
    it is opened), not a folder; a ``ConfigError`` where it is a FIFO, a device or a socket,
    whose reading waits for a writer (deaf to Ctrl-C, in pyarrow's or array-record's C++) or
    never ends (``/dev/zero``)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return True
    if stat.S_ISDIR(mode):
        return False
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device")
        raise ConfigError(f"{owner}(paths): {path!r} is {kind}, not a regular file (reading it "
                          "would wait for a writer, or never end); pass regular files")
    return True


def _remote_glob(pattern: str, owner: str, dataset: bool = False) -> list[str]:
    """``gs://bucket/dir/train-*.parquet``: the files of the folder whose names match,
    listed through ``etils.epath`` (a pattern in the file name only), those a local pattern
    leaves out left out as well: a name with a dot first (glob's rule), or, for a
    ``dataset``, an underscore (a job's ``_tmp.parquet``), unless the pattern names it so."""

    from etils import epath

    folder, _, name = pattern.rpartition("/")
    if any(c in folder.split("://", 1)[1] for c in PATTERN):
        raise ConfigError(
            f"{owner}(paths): {pattern!r} has a pattern in a folder's name; a remote pattern "
            "may match file names only (gs://bucket/dir/train-*.parquet): pass one a folder"
        )
    names = sorted(p.name for p in epath.Path(folder).iterdir())
    return [f"{folder}/{n}" for n in names if fnmatch.fnmatchcase(n, name) and not (
        left_out(n, dataset) and not left_out(name, dataset))]


def path_names(paths: Sequence[str]) -> list[str]:
    """``paths`` relative to the folder they all are in, for a fingerprint: the same dataset
    copied to another disk, or staged at another path on each host, keeps its fingerprint.

    Example:
        >>> path_names(["/data/a/x.parquet", "/data/b/y.parquet"])
        ['a/x.parquet', 'b/y.parquet']
        >>> path_names(["/mnt/one.parquet"])
        ['one.parquet']
    """
    parts = [os.fspath(p).replace(os.sep, "/").split("/") for p in paths]
    common = 0
    if parts:
        folder = parts[0][:-1]
        while common < len(folder) and all(len(p) > common + 1 and p[common] == folder[common]
                                           for p in parts):
            common += 1
    return ["/".join(p[common:]) for p in parts]


def files_fingerprints(kind: str, count: int, paths: Sequence[str],
                       *parts: bytes | str) -> tuple[str, str]:
    """A file source's fingerprint, ``"<kind>:<count>:<digest>"`` of its files' names
    (``path_names``) and ``parts``, and the one states saved before 2026-11-28 hold (of the
    whole paths): its ``fingerprint`` and its ``older_fingerprints``.

    Example:
        >>> now, then = files_fingerprints("files", 1, ["/a/x.jpg"])
        >>> now == files_fingerprints("files", 1, ["/b/x.jpg"])[0], now == then
        (True, False)
    """
    def of(names: Sequence[str]) -> str:
        digest = hashlib.blake2b(digest_size=16)
        digest.update("\0".join(names).encode(errors="surrogatepass"))
        for part in parts:
            digest.update(part if isinstance(part, bytes) else part.encode(
                errors="surrogatepass"))
        return f"{kind}:{count}:{digest.hexdigest()}"
    return of(path_names(paths)), of(paths)
