"""A loader alone, without a model: its stage table and verdict at a few worker counts, and a
picture of what each worker did.

::

    python -m jaxloader.profile my_module:make_loader --steps 300 [--workers 0,1,2,4]
                                                      [--out profile.png]
    jl.profile(make_loader or loader, steps=300)   (a notebook shows the picture inline)

``make_loader(num_workers=n)`` builds the loader to profile (a module path, or a file
``path/to/file.py:make_loader``); a loader given as it is is profiled at its own count and
left open where it was: its position restored after the run (iterate it anew: its live
iterators are stale, as after ``load_state_dict``), its stats started again before the run and
after it (the run's stats are the profile's alone, and the profile's batches are none of
yours). Each count runs ``steps`` batches taken as fast as they come, its stages traced; the
picture has each worker's stages on a timeline (the fastest count's last 40 batches) and the
batches a second at each count.

Example:
    >>> import time, numpy as np, jaxloader as jl
    >>> slow = jl.Map(lambda r: time.sleep(0.001) or r)  # (a record's work: 1 ms)
    >>> make = lambda num_workers: jl.DataLoader(jl.ArraySource({"x": np.arange(256)}),
    ...     batch_size=8, num_workers=num_workers, num_epochs=None, process_index=0,
    ...     process_count=1, transforms=[slow])
    >>> report = jl.profile(make, steps=20, workers=(0,), out=None)
    >>> report.best.workers, report.best.diagnosis.bottleneck
    (0, 'main')
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import io
import os
import re
import sys
import uuid
import warnings
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np

from jaxloader.base.checks import Int, check_int
from jaxloader.base.errors import ConfigError, JaxloaderWarning
from jaxloader.base.timings import LOOP
from jaxloader.loaders.base import LoaderLifecycle
from jaxloader.loaders.diagnosis import Diagnosis, cores_available

_TIMELINE_BATCHES = 40  # the timeline shows the fastest count's last ~this many batches


class Run(NamedTuple):
    """One worker count's run."""

    workers: int
    batches_per_s: float
    diagnosis: Diagnosis
    trace: list  # a (stage, start, end) list a process that made batches


class Profile:
    """What ``profile`` measured: a ``Run`` a count, the fastest (``best``), the picture."""

    def __init__(self, runs: list[Run], png: bytes | None, path: str | None) -> None:
        self.runs, self.png, self.path = runs, png, path
        self.best = max(runs, key=lambda r: r.batches_per_s)

    def __str__(self) -> str:
        lines = ["workers  batches/s  bottleneck"]
        lines += [f"{r.workers:7d}  {r.batches_per_s:9.1f}  {r.diagnosis.bottleneck}"
                  for r in self.runs]
        lines += ["", f"the fastest: num_workers={self.best.workers}",
                  str(self.best.diagnosis._replace(advice=self._measured_advice()))]
        if self.path:
            lines.append(f"picture: {self.path}")
        elif self.png is None:
            lines.append('no picture: matplotlib is not installed (pip install '
                         '"jaxloader[profile]")')
        return "\n".join(lines)

    def _measured_advice(self) -> tuple[str, ...]:
        """The fastest run's advice, but where it advises a worker count this profile ran
        (slower): that run's figure instead (the estimate's hand-over cost is a floor; here
        2 workers advised at ~2.1x had run at 0.6x)."""
        rate = {r.workers: r.batches_per_s for r in self.runs}
        best = self.best
        advice = []
        for line in best.diagnosis.advice:
            n = next((int(k) for k in re.findall(r"num_workers=(\d+)\b", line)
                      if int(k) != best.workers), None)  # (not "(num_workers=0): ...")
            if n is not None and n in rate:
                line = (f"num_workers={n} ran here at {rate[n]:.1f} batches/s, "
                        f"{rate[n] / best.batches_per_s:.2f}x num_workers={best.workers}'s "
                        f"(advised, from the stage times: {line})")
            advice.append(line)
        return tuple(advice)

    def _repr_png_(self) -> bytes | None:  # (the picture alone, where HTML is not shown)
        return self.png

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))  # (IPython's text: the table)

    def _ipython_display_(self) -> None:
        """What a notebook shows: the table and advice, then the picture (a ``_repr_png_``
        alone showed the picture without them; HTML with the picture in it kept it twice in
        the notebook's file)."""
        from IPython.display import Image, display

        print(self)
        if self.png is not None:
            display(Image(data=self.png, format="png"))


def _one(loader: Any, steps: int, own: bool) -> Run:
    """``steps`` batches of ``loader`` as fast as they come, traced; its run. A loader of the
    caller's (``own`` False) is left open at the position it had, its tracing as it was; one
    made here is closed."""
    engine = loader._engine
    traced, engine.gauges.trace = engine.gauges.trace, True
    before = None if own else loader.state_dict()
    if not own:  # the batches before are not the profile's
        loader.reset_stats()
    try:
        loader._probing = True  # (its iter(): not paired with the other processes', as it
        # may run on one process alone, and puts the position back)
        it = iter(loader)
        for done in range(steps):
            try:
                next(it)
            except StopIteration:
                fewer = f", or pass steps={done} or fewer" if done >= 3 else ""
                raise ConfigError(
                    f"profile: the loader ran out after {done} batches, of steps={steps}; "
                    f"make it with num_epochs=None (endless){fewer}") from None
        stats = loader.stats
        return Run(engine.active, stats.batches_per_s, loader.diagnose(),
                   [list(m.fold().trace) for m in engine.gauges.makers])
    finally:
        loader._probing = False
        if own:
            loader.close()
        else:
            engine.gauges.trace = traced
            if loader._progress.broken is None and not loader._progress.closed:  # (else its
                loader.load_state_dict(before)  # error, raised, stays the one said)
            loader.reset_stats()  # the profile's batches are not the caller's


def profile(loader: Any, steps: Int = 300, workers: Sequence[Int] | None = None,
            out: str | os.PathLike[str] | None = "jaxloader_profile.png") -> Profile:
    """Runs ``loader`` (a ``DataLoader``/``StreamLoader``, or ``make_loader(num_workers=n)``
    to try several counts: by default 0, 1, 2 and the cores) for ``steps`` batches a count;
    writes the picture to ``out`` (``None``: kept in memory only, ``Profile.png``).

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> loader = jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=4,
        ...                        num_epochs=None, process_index=0, process_count=1)
        >>> report = jl.profile(loader, steps=5, out=None)  # print(report) for its table
        >>> [run.workers for run in report.runs], loader.step  # its position put back
        ([0], 0)
    """
    steps = check_int("profile(steps=)", steps, low=3, remedy="batches a count, the first "
                      "the workers' start: 300 gives a steady picture")
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise ConfigError(f"profile(out=): expected a file's path for the picture, or None, "
                          f"got {type(out).__name__} {out!r:.80}")
    out = None if out is None else os.fspath(out)
    folder = "" if out is None else os.path.dirname(os.path.abspath(out))
    if out is not None and (os.path.isdir(out) or not os.path.isdir(folder) or not os.access(
            folder, os.W_OK)):  # (said now, not after the runs)
        what = "a folder" if os.path.isdir(out) else "its folder does not exist" if not \
            os.path.isdir(folder) else "its folder cannot be written"
        raise ConfigError(f"profile(out={out!r}): {what}; pass a file's path in a folder that "
                          "exists, or out=None to keep the picture in memory (Profile.png)")
    if callable(loader) and not hasattr(loader, "state_dict"):
        listed = workers if workers is not None else (0, 1, 2, cores_available())
        listed = list(listed) if isinstance(listed, Iterable) and not isinstance(
            listed, (str, bytes)) else []  # (a set, a generator: taken)
        if not listed or any(isinstance(n, (bool, np.bool_)) or not isinstance(
                n, (int, np.integer)) or n < 0 for n in listed):
            raise ConfigError(f"profile(workers=): expected a list of worker counts of 0 or "
                              f"more, got {workers!r}; e.g. workers=(0, 1, 2), or leave it None")
        counts = sorted({int(n) for n in listed})
        runs = [_one(_made(loader, n), steps, own=True) for n in counts]
    elif not isinstance(loader, LoaderLifecycle):
        raise ConfigError(f"profile: expected a DataLoader, a StreamLoader or a function "
                          f"make_loader(num_workers=n) returning one, got "
                          f"{type(loader).__name__}")
    elif workers is not None:
        raise ConfigError(f"profile(workers={workers!r}) with a loader: a loader runs at its "
                          "own num_workers; pass make_loader (a function of num_workers) to "
                          "try several counts")
    else:
        runs = [_one(loader, steps, own=False)]
    png = _picture(runs)
    if out is not None and png is not None:
        target = os.path.realpath(out)  # (a link's target, written through it)
        partial = f"{target}.{uuid.uuid4().hex}.partial"  # (each host's: pids repeat)
        try:  # (whole or not at all: a full disk left a cut picture over the last one)
            with open(partial, "xb") as f:
                f.write(png)
            if os.path.exists(target):  # (its mode kept)
                os.chmod(partial, os.stat(target).st_mode & 0o7777)
            os.replace(partial, target)
        except BaseException as e:
            if os.path.exists(partial):
                os.remove(partial)
            if not isinstance(e, OSError):
                raise
            warnings.warn(f"profile(out={out!r}): the picture could not be written ("
                          f"{e.strerror or e}); it is kept in memory (Profile.png): pass "
                          "another path, or free space there", JaxloaderWarning, stacklevel=2)
            out = None
    return Profile(runs, png, out if png is not None else None)


def _made(make: Callable[..., Any], num_workers: int) -> Any:
    """``make(num_workers=num_workers)``, checked to be a loader; one that takes no
    ``num_workers=`` refused by its signature (a ``TypeError`` it raises is its own: a
    loader's remedy for Grain's ``worker_count=`` names ``num_workers=`` too)."""
    try:  # (a decorator's wrapper, functools.wraps: the wrapped one's, unless its own names
        if not _names(make):  # num_workers: an adapter; one of *args, **kwargs tells nothing)
            inspect.signature(make).bind(num_workers=num_workers)
    except ValueError:  # (no signature to read: a builtin's, called as it is)
        pass
    except TypeError as e:
        raise ConfigError(f"profile: {getattr(make, '__name__', make)!r} takes no num_workers= "
                          f"({e}); profile calls make_loader(num_workers=n) for each count "
                          "tried") from e
    loader = make(num_workers=num_workers)
    if not isinstance(loader, LoaderLifecycle):
        raise ConfigError(f"profile: {getattr(make, '__name__', make)!r}(num_workers="
                          f"{num_workers}) returned {type(loader).__name__}; expected a "
                          "DataLoader or a StreamLoader")
    return loader


def _names(make: Callable[..., Any]) -> bool:
    """Whether ``make``'s own signature, not the one it wraps, names ``num_workers``."""
    try:
        return "num_workers" in inspect.signature(make, follow_wrapped=False).parameters
    except (TypeError, ValueError):
        return False


def _picture(runs: list[Run]) -> bytes | None:
    """The timeline of the fastest run's workers and the rate at each count (PNG), or None
    without matplotlib."""
    try:  # (a Figure of its own: no backend chosen, pyplot's left as the user set it; a
        import matplotlib  # notebook's inline plots went Agg, shown no more)
        from matplotlib.figure import Figure
    except ImportError:
        return None
    best = max(runs, key=lambda r: r.batches_per_s)
    fig = Figure(figsize=(10, 6.5))
    top, bottom = fig.subplots(2, 1, gridspec_kw={"height_ratios": [3, 1.4]})
    ends = [end for spans in best.trace for _, _, end in spans]
    last = max(ends, default=0.0)
    shown = _TIMELINE_BATCHES / best.batches_per_s if best.batches_per_s else 1.0
    colours: dict[str, Any] = {}
    palette = matplotlib.colormaps["tab10"]
    for row, spans in enumerate(best.trace):
        bars: dict[str, list] = {}
        for stage, start, end in spans:
            if end >= last - shown:
                name = "read + record transforms" if stage == LOOP else stage
                bars.setdefault(name, []).append((start - last, end - start))
        for name, extents in bars.items():
            colour = colours.setdefault(name, palette(len(colours) % 10))
            top.broken_barh(extents, (row - 0.4, 0.8), color=colour, label=name)
    handles, labels = top.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    top.legend(unique.values(), unique.keys(), loc="upper left", fontsize=8, ncol=3)
    who = "worker" if best.workers else "training process"
    top.set_yticks(range(len(best.trace)),
                   [f"{who} {i}" if best.workers else who for i in range(len(best.trace))])
    top.set_xlabel("seconds before the last batch made")
    top.set_title(f"num_workers={best.workers}: each process's stages "
                  f"(bottleneck: {best.diagnosis.bottleneck})")
    bottom.bar([str(r.workers) for r in runs], [r.batches_per_s for r in runs], color="grey")
    bottom.set_xlabel("num_workers")
    bottom.set_ylabel("batches / s")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def _factory(target: str) -> Callable[..., Any]:
    """``module:function`` or ``path/to/file.py:function``."""
    where, _, name = target.rpartition(":")
    if not where or not name:
        raise ConfigError(f"expected module:function or file.py:function, got {target!r}")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location("_profiled", where)
        if spec is None or spec.loader is None or not os.path.isfile(where):
            raise ConfigError(f"profile: cannot import {where!r} (no such Python file); "
                              "pass path/to/file.py:make_loader or module:make_loader")
        module = importlib.util.module_from_spec(spec)
        sys.modules["_profiled"] = module
        folder = os.path.dirname(os.path.abspath(where))  # (as `python file.py` puts it
        if folder not in sys.path:  # first: its own modules beside it import; the workers
            sys.path.insert(0, folder)  # get it with sys.path; the env audit)
        spec.loader.exec_module(module)
        import cloudpickle  # a worker cannot import it by that name: its code goes by value

        cloudpickle.register_pickle_by_value(module)
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            if e.name is None or not (where == e.name or where.startswith(e.name + ".")):
                raise  # a module the target's own code imports: its own error
            raise ConfigError(f"profile: no module {where!r} to import (from {target!r}); run "
                              "from the folder that holds it, or pass path/to/file.py:"
                              f"{name}" + (" (Python runs in safe-path mode, PYTHONSAFEPATH or "
                                           "-P: the folder it runs from is not on sys.path; "
                                           "PYTHONPATH=. puts it there)"
                                           if getattr(sys.flags, "safe_path", False) and (
                                               os.path.exists(where.split(".")[0] + ".py") or
                                               os.path.isdir(where.split(".")[0])) else "")
                              ) from None
    if not hasattr(module, name):
        public = sorted(k for k, v in vars(module).items() if callable(v) and k[0] != "_")
        raise ConfigError(f"profile: {where!r} has no {name!r}; its functions: "
                          f"{', '.join(public[:12]) or 'none'}")
    return getattr(module, name)


def _counts(text: str) -> list[int]:
    """``--workers``' counts: ``0,1,2,4``."""
    try:
        return [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 0,1,2,4, got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jaxloader.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="module:make_loader or file.py:make_loader")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--workers", type=_counts, help="counts to try, e.g. 0,1,2,4")
    parser.add_argument("--out", default="jaxloader_profile.png")
    args = parser.parse_args(argv)
    try:
        report = profile(_factory(args.target), args.steps, args.workers, args.out)
    except ConfigError as e:  # a named mistake and its remedy: no traceback
        parser.error(str(e))
    print(report)


if __name__ == "__main__":
    main()
