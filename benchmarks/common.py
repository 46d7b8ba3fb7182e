"""Helpers shared by the benchmarks: timing with repeats, medians, markdown tables."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from typing import Any, Callable, Iterable, Iterator

import numpy as np

OUT_DIR = os.path.join(os.path.dirname(__file__), "out")


def rate(run_epoch: Callable[[], int], repeats: int, min_seconds: float = 0.5) -> dict:
    """Runs ``run_epoch`` (returns records done) ``repeats`` times; median records/s.

    Each repeat runs at least ``min_seconds`` so short epochs are not dominated by timer noise.
    """
    rates = []
    for _ in range(repeats):
        done, start = 0, time.perf_counter()
        while True:
            done += run_epoch()
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        rates.append(done / elapsed)
    return {"median": statistics.median(rates), "all": rates}


def input_wait(it: Iterator, step: Callable, total: Any, steps: int,
               unwrap: Callable = lambda b: b, warm_s: float = 0.0) -> tuple[float, float]:
    """(share of the loop spent in ``next(it)``, seconds a step) over ``steps`` steps of
    ``total = step(total, image, label)``, each blocked until done, after a warm-up of at
    least 5 steps and ``warm_s`` seconds (compilation, buffers filling, workers starting)."""
    start, taken = time.perf_counter(), 0
    while taken < 5 or time.perf_counter() - start < warm_s:
        b = unwrap(next(it))
        total = step(total, b["image"], b["label"]).block_until_ready()
        taken += 1
    waited = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        b = unwrap(next(it))
        waited += time.perf_counter() - t0
        total = step(total, b["image"], b["label"]).block_until_ready()
    elapsed = time.perf_counter() - start
    return waited / elapsed, elapsed / steps


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def table(rows: Iterable[tuple], headers: tuple) -> str:
    rows = list(rows)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def save(name: str, results: dict) -> str:
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, f"{name}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    return path


def shared_bytes(pid: int) -> int:
    """Bytes of the memory files ``pid`` holds open, and of its segments in /dev/shm."""
    total, seen = 0, set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:jaxloader"):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                if st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
        except OSError:
            continue
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"jaxloader_{pid}_"):
            total += os.stat(f"/dev/shm/{name}").st_blocks * 512
    return total


class RecordSource:
    """A plain random-access source of {"image", "label"} records: what every peer reads."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": self.labels[i]}
