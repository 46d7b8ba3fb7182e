"""The files under a folder and those a pattern matches, found by one walk that follows links
and reads each real folder once (``walk_folders``): a link to a parent (``up -> ..``) was
followed for ever (``glob``'s ``**``: two such links under ``d/`` and ``d/**/*.jsonl`` never
returned), a ``latest -> v2`` beside ``v2`` read twice a pass. For ``sources.paths.expand``.

Example:
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> os.makedirs(os.path.join(d, "a", "b"))
    >>> open(os.path.join(d, "a", "b", "x.jsonl"), "w").close()
    >>> os.symlink("..", os.path.join(d, "a", "up"))
    >>> [os.path.relpath(f, d) for f in pattern_matches(os.path.join(d, "**", "*.jsonl"), "X", {})]
    ['a/b/x.jsonl', 'a/up/a/b/x.jsonl']

(A link into the tree is matched by its name, one link deep: ``sources.paths`` keeps each
file once, by its own name where the pattern reaches it.)
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import os
import warnings
from typing import Iterable

from jaxloader.base.errors import ConfigError, JaxloaderWarning, user_stacklevel

PATTERN = "*?["  # (what makes a path a pattern)


def pattern_matches(pattern: str, owner: str, reals: dict[str, str]) -> list[str]:
    """``glob.glob(pattern, recursive=True)``: a local pattern's files and folders, a ``**``
    in it matched over ``walk_folders`` (a part naming hidden names, ``.cache/*``: by
    ``glob``); ``reals`` gets each walked folder's real path."""
    root, parts = fixed_folder(pattern)
    if "**" not in parts or any(p[:1] == "." for p in parts) or not os.path.isdir(root):
        return glob.glob(pattern, recursive=True)
    split = pattern.split(os.sep)  # (named as glob names them: "**/x" from the folder, not
    head = os.sep.join(split[:len(split) - len(parts)]) or root.rstrip(os.curdir)  # "./**/x")
    folders_only = parts[-1] == ""  # ("x/**/": its folders, named with a "/" last)
    wanted = tuple(parts[:-1] if folders_only else parts)
    links: list[tuple[str, str]] = []  # (links into the tree, not walked: by their names too)
    walked = list(walk_folders(root, False, owner, reals, links))
    found = []
    for top, files in walked + _through_links(walked, links, reals):
        inner = [] if top == root else os.path.relpath(top, root).split(os.sep)
        for names in [inner] + ([] if folders_only else [inner + [name] for name in files]):
            if _matched(tuple(names), wanted) and (names or head):  # (the root too: "x/**"
                # names "x/", as glob; "**" from the folder here does not name it, "")
                found.append(os.path.join(head, *names, *[""] * (folders_only or not names)))
    return found


def _through_links(walked: list[tuple[str, list[str]]], links: list[tuple[str, str]],
                   reals: dict[str, str]) -> list[tuple[str, list[str]]]:
    """The walked folders again under each link into the tree that leads to them (a link
    under a link too, ``runs/exp/latest -> ../shared`` holding ``ext -> /data/ext``: what
    glob names), each chain of links once through a folder (a link back to a parent: not for
    ever), at most ``_ALIASES`` of them (then warned of)."""
    where: dict[str, str] = {}
    for top, _ in walked:
        where.setdefault(reals[top], top)  # (a real folder's walked name)
    out: list[tuple[str, list[str]]] = []
    todo = [(link, real, frozenset[str]()) for link, real in links]
    while todo:
        link, real, chain = todo.pop()
        base = where.get(real)
        if base is None or real in chain:
            continue
        chain = chain | {real}
        out.extend((link + top[len(base):], files) for top, files in walked
                   if _under(top, base))
        todo.extend((link + inner[len(base):], target, chain) for inner, target in links
                    if inner != base and _under(inner, base))
        if len(out) > _ALIASES:
            warnings.warn(f"a pattern's ** over {len(links):,} links into its folder names "
                          f"its files by more than {_ALIASES:,} chains of links: those past "
                          "them are left out; pass the folder, or a pattern without **",
                          JaxloaderWarning, stacklevel=user_stacklevel())
            break
    return out


_ALIASES = 100_000  # folders named through links a pattern's ** looks at, at most


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


@functools.lru_cache(maxsize=4096)
def _matched(names: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """Whether a path's ``names`` below the pattern's fixed folder match its ``parts``: a
    ``**`` any number of names, any other part one (none hidden: ``walk_folders`` left them
    out)."""
    if not parts:
        return not names
    if parts[0] == "**":
        return _matched(names, parts[1:]) or bool(names) and _matched(names[1:], parts)
    return bool(names) and fnmatch.fnmatchcase(names[0], parts[0]) and _matched(names[1:],
                                                                                  parts[1:])


def fixed_folder(pattern: str) -> tuple[str, list[str]]:
    """The folder of ``pattern`` before its first part with a wildcard, and the parts after."""
    parts = pattern.split(os.sep)
    fixed = next(i for i, p in enumerate(parts) if any(c in p for c in PATTERN))
    return os.sep.join(parts[:fixed]) or (os.sep if os.path.isabs(pattern) else os.curdir), \
        parts[fixed:]


def _within(real: str, inside: str, dataset: bool) -> bool:
    """Whether a link to the folder ``real`` (its real path) leads to files the walk of
    ``inside`` lists under their own names (``inside`` itself, or a folder in it not left
    out): a ``latest -> v2`` beside ``v2`` read them twice a pass, a link to ``.`` forty
    times; one to ``.versions/v3`` (left out) is their only way in."""
    if real != inside and not real.startswith(inside.rstrip(os.sep) + os.sep):
        return False
    return not any(left_out(part, dataset)
                   for part in os.path.relpath(real, inside).split(os.sep) if part != ".")


def left_out(name: str, dataset: bool) -> bool:
    """Whether a folder's listing leaves ``name`` out: a dot first (as glob's ``**``), or, for a
    ``dataset``, an underscore (Spark's ``_temporary/``, as pandas and pyarrow)."""
    return name[:1] == "." or (dataset and name[:1] == "_")


def walk_folders(folder: str, dataset: bool, owner: str, reals: dict[str, str],
                 links: list[tuple[str, str]] | None = None
                 ) -> Iterable[tuple[str, list[str]]]:
    """``(path, names)`` of ``folder`` and each folder under it, with the names of their files
    (a link to nothing is one) not left out (``_left_out``), depth first in name order, links
    followed. Each real folder is walked once, by the first of its names in that order
    (``current`` and ``stable`` linked to one hidden version read it twice a pass; a link to a
    parent for ever); a link into ``folder``'s own files is not walked (``_within``). Only
    links' real paths are looked up (each part of a path costs a call: one per folder made a
    walk of 20,000 folders 60% slower); ``reals`` gets each walked folder's. A folder under
    ``folder`` that cannot be listed is warned of (``lost+found`` is not), ``folder`` refused."""
    inside = os.path.realpath(folder)
    walked: set[str] = set()
    ahead = [(folder, inside)]
    while ahead:
        top, real = ahead.pop()
        if real in walked:
            continue
        walked.add(real)
        reals[top] = real
        try:
            entries = sorted(os.scandir(top), key=lambda e: e.name)
        except OSError as e:  # (a disk's root holds lost+found, root's alone: left out)
            if top != folder and os.path.basename(top) != "lost+found":
                warnings.warn(f"{owner}(paths): the folder {top!r} cannot be listed "
                              f"({e.strerror}): its files are left out; make it readable, or "
                              "pass a pattern or the files' paths", JaxloaderWarning,
                              stacklevel=user_stacklevel())
            elif top == folder:
                raise ConfigError(f"{owner}(paths): the folder {top!r} cannot be listed "
                                  f"({e.strerror}); make it readable, or pass the files' "
                                  "paths") from e
            continue
        files, folders = [], []
        for entry in entries:
            if left_out(entry.name, dataset):
                continue
            try:
                is_folder = entry.is_dir()
            except OSError:  # (a link too deep to follow: named where it is opened)
                is_folder = False
            if not is_folder:
                files.append(entry.name)
            elif not entry.is_symlink():
                folders.append((entry.path, os.path.join(real, entry.name)))
            elif not _within(linked := os.path.realpath(entry.path), inside, dataset):
                folders.append((entry.path, linked))
            elif links is not None:  # (not walked: ``links`` gets it, ``(path, real path)``)
                links.append((entry.path, linked))
        yield top, files
        ahead.extend(reversed(folders))


