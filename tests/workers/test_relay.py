"""What a worker's code logs and warns reaches the training process's handlers and warning
filters (``jaxloader.workers.relay``), as with ``num_workers=0``."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.workers import relay
from jaxloader.workers.protocol import Said

log = logging.getLogger("tests.augment")


class BlankImage(UserWarning):
    pass


def _noisy(record):
    x = int(record["x"])
    if x % 8 == 3:
        log.info("record %d is odd", x)
        warnings.warn(BlankImage(f"record {x % 2} blank"))
    if x == 13:
        try:
            1 / 0
        except ZeroDivisionError:
            log.exception("record %d failed", x)
    log.debug("never shown")
    return record


def _loader(num_workers, **kw):
    return jl.DataLoader(jl.ArraySource({"x": np.arange(32)}), batch_size=8,
                         transforms=[jl.Map(_noisy)], num_workers=num_workers,
                         process_index=0, process_count=1, **kw)


def test_a_transforms_log_records_reach_the_trainers_handlers(caplog):
    # a worker's log.info went nowhere (its root logger had no handler, its level WARNING) and
    # its log.exception to its own standard error, out of the trainer's handlers and files
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BlankImage)
        with _loader(2) as loader:
            assert len(list(loader)) == 4
    records = [r for r in caplog.records if r.name == "tests.augment"]
    assert sorted(r.getMessage().split("\n")[0] for r in records) == sorted(
        [f"record {x} is odd" for x in (3, 11, 19, 27)] + ["record 13 failed"])
    assert {r.processName for r in records} == {"jaxloader-worker-0", "jaxloader-worker-1"}
    failed = next(r for r in records if r.levelno == logging.ERROR)
    assert "ZeroDivisionError: division by zero" in failed.getMessage()  # (its traceback)
    assert "test_relay.py" in failed.pathname and failed.funcName == "_noisy"


def test_a_workers_warnings_meet_the_trainers_filters():
    # a worker's warnings went to its standard error: pytest.warns and catch_warnings never saw
    # them, and a filter set in code (simplefilter("error", ...)) was not the worker's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        with _loader(2) as loader:
            list(loader)
    said = [(type(w.message), str(w.message)) for w in caught if "blank" in str(w.message)]
    assert said == [(BlankImage, "record 1 blank")]  # (four times, by two workers: said once)
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error", BlankImage)
        with _loader(2) as loader, pytest.raises(jl.WorkerError, match=r"raised BlankImage: "
                                                 r"record 1 blank"):
            list(loader)


def test_records_and_warnings_over_what_a_worker_keeps_are_counted_and_said(caplog,
                                                                              monkeypatch):
    monkeypatch.setattr(relay, "MOST_KEPT", 3)
    kept = relay._Kept()
    for i in range(4):
        kept.put_nowait(logging.makeLogRecord({"name": "tests.augment", "msg": f"{i}"}))
    kept.warning(UserWarning("over"), UserWarning, __file__, 1)
    assert ([r.msg for r in kept.records], kept.warnings, kept.dropped) == (["0", "1", "2"], [], 2)
    with caplog.at_level(logging.WARNING, "jaxloader"):
        relay.Heard().replay(Said([], [], kept.dropped), 3)
    assert ("worker 3 logged and warned more than 3 times between two of its messages: 2 "
            "records and warnings were dropped") in caplog.text
