"""``Diagnosis``: ``loader.diagnose()``'s verdict (``loaders.diagnosis`` reaches it): what limits
the input, seconds by stage, the advice, and its table (``str()``, a notebook's display).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, NamedTuple

from jaxloader.base.timings import HANDOVER, PLACE, SLOT_WAIT, STEP, WAIT, once

Bottleneck = Literal["step", "workers", "source", "main", "device"]
MAIN_STAGES = (HANDOVER, PLACE, WAIT, STEP)


class Diagnosis(NamedTuple):
    """What limits the input (``bottleneck``), seconds by stage, and advice; ``str()`` is a
    table.

    Example:
        >>> import jaxloader as jl
        >>> d = jl.Diagnosis("workers", {"read": 0.1, "Map(decode)": 0.9}, ("num_workers=4",),
        ...                  batches=10, wait_fraction=0.5, num_workers=1)
        >>> print(d)  # doctest: +NORMALIZE_WHITESPACE
        input bottleneck: workers (the consumer waited 50% of its time after the first batch;
        1 worker, 10 batches)
          stage                     seconds  ms a batch  share
          Map(decode)                 0.900        90.0    90%
          read                        0.100        10.0    10%
        advice:
          - num_workers=4
    """

    #: what limits the input: ``"step"`` (nothing: the input keeps up), ``"workers"``
    #: (transforms, collation), ``"source"`` (its reads), ``"main"`` (the training process's
    #: work: batches made in it, the hand-over) or ``"device"`` (placement)
    bottleneck: Bottleneck
    #: seconds by stage (``LoaderStats.stages``)
    stages: Mapping[str, float]
    #: what to change, most useful first
    advice: tuple[str, ...]
    #: batches handed out in the window read
    batches: int = 0
    #: the share of the loop's time spent waiting for input, after the first batch
    wait_fraction: float = 0.0
    #: worker processes in use
    num_workers: int = 0
    #: batches made (the makers' stages are a batch made's, not one handed out)
    batches_made: int = 0

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))  # (a notebook cell ending in loader.diagnose(): the table)

    def __str__(self) -> str:
        made = {k: v for k, v in self.stages.items() if k not in MAIN_STAGES and not once(k)}
        main = {k: v for k, v in self.stages.items() if k in MAIN_STAGES}
        total = sum(v for k, v in made.items() if k != SLOT_WAIT) or 1.0  # (the makers' own
        # work, as the advice's shares: a slot wait is the training process's)
        workers = "worker" if self.num_workers == 1 else "workers"
        lines = [f"input bottleneck: {self.bottleneck} (the consumer waited "
                 f"{self.wait_fraction:.0%} of its time after the first batch; "
                 f"{self.num_workers} {workers}, {self.batches} batches)",
                 f"  {'stage':<24} {'seconds':>8} {'ms a batch':>11} {'share':>6}"]
        per, per_made = max(1, self.batches), max(1, self.batches_made or self.batches)
        for name, seconds in sorted(made.items(), key=lambda kv: -kv[1]):
            share = f"{seconds / total:6.0%}" if name != SLOT_WAIT else f"{'(wait)':>6}"
            lines.append(f"  {name[:24]:<24} {seconds:8.3f} {1e3 * seconds / per_made:11.1f} "
                         f"{share}")
        for name, seconds in main.items():
            lines.append(f"  {name[:24]:<24} {seconds:8.3f} {1e3 * seconds / per:11.1f} "
                         f"{'(main)':>6}")
        for name, seconds in self.stages.items():  # (a JitMap's compilation: once a shape)
            if once(name):
                lines.append(f"  {name[:24]:<24} {seconds:8.3f} {'':>11} {'(once)':>6}")
        lines.append("advice:")
        lines += [f"  - {line}" for line in self.advice] or ["  - none"]
        return "\n".join(lines)
