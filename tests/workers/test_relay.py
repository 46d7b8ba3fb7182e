"""What a worker's code logs and warns reaches the training process's handlers and warning
filters (``jaxloader.workers.relay``), as with ``num_workers=0``."""

from __future__ import annotations

import logging
import os
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.workers import relay, relay_worker
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
    monkeypatch.setattr(relay_worker, "MOST_KEPT", 3)
    kept = relay_worker._Kept()
    for i in range(4):
        kept.keep([None, ("w", f"UserWarning: {i}", __file__, 1), 0], urgent=False)
    kept.warning(UserWarning("over"), UserWarning, __file__, 1)
    assert ([plain[1] for _, plain, _ in kept.items], kept.dropped) == (
        ["UserWarning: 0", "UserWarning: 1", "UserWarning: 2"], 2)
    with caplog.at_level(logging.WARNING, "jaxloader"):
        relay.Heard().replay(Said([], kept.dropped), 3)
    assert ("worker 3 logged and warned more than 50000 times before this process read them "
            "(it reads them as it reads batches, in next()): 2 records and warnings were "
            "dropped") in caplog.text


class ShapeWarning(UserWarning):
    def __init__(self, shape, text):  # (pickles; unpickles as ShapeWarning(*args): it cannot)
        super().__init__(text)
        self.shape = shape


def _odd_shape(record):
    if int(record["x"]) == 5:
        warnings.warn(ShapeWarning((3, 4), "record 5 has an odd shape"))
        log.warning("odd shape", extra={"detail": ShapeWarning((3, 4), "detail")})
    return record


def test_a_warning_that_does_not_unpickle_comes_as_its_text(caplog):
    # every next() after it raised the unpickling's TypeError from the pool, and the workers
    # were restarted to make the step again, which warned again: the loop never went on
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with jl.DataLoader(jl.ArraySource({"x": np.arange(16)}), batch_size=4,
                           transforms=[jl.Map(_odd_shape)], num_workers=2, process_index=0,
                           process_count=1) as loader:
            assert len(list(loader)) == 4
    assert [str(w.message) for w in caught if "odd" in str(w.message)] == [
        "ShapeWarning: record 5 has an odd shape"]
    assert [r.getMessage() for r in caplog.records if r.name == "tests.augment"] == ["odd shape"]


def _warn_then_die(record):
    log.info("record %d decoded", int(record["x"]))  # (a backlog of records before it)
    if int(record["x"]) == 6:
        for line in range(12):  # (a burst: each of them said before the kill)
            log.error("record %d: its header says 2**40 pixels (%d)", int(record["x"]), line)
        warnings.warn("decoding a bomb")
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)  # (as the kernel's OOM killer would)
    return record


def test_what_a_worker_said_before_it_was_killed_is_said(caplog):
    # records and warnings waited for the task's end in the worker: those of a worker killed
    # (out of memory, a segfault) went with it, where they had been on its stderr before
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as caught, jl.DataLoader(
            jl.ArraySource({"x": np.arange(16)}), batch_size=4,
            transforms=[jl.Map(_warn_then_die)], num_workers=1, process_index=0,
            process_count=1) as loader:
        warnings.simplefilter("always")
        with pytest.raises(jl.WorkerError, match="killed by signal 9"):
            list(loader)
    assert [r.getMessage().rsplit(" ", 1)[1] for r in caplog.records if r.levelno ==
            logging.ERROR and r.name == "tests.augment"] == [f"({line})" for line in range(12)]
    assert [str(w.message) for w in caught] == ["decoding a bomb"]


def test_a_warning_is_said_again_under_the_trainers_filters_of_the_moment():
    # each worker showed a warning once ("default", its filters as it started) and sent only
    # that: a pytest.warns around a later pass of the loader saw nothing
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        with _loader(2) as loader:
            start = loader.state_dict()
            with pytest.warns(BlankImage, match="record 1 blank"):
                assert len(list(loader)) == 4
            loader.load_state_dict(start)
            with pytest.warns(BlankImage, match="record 1 blank") as caught:
                assert len(list(loader)) == 4  # (said again, once a task: not 4 times)
    assert 1 <= len([w for w in caught if "blank" in str(w.message)]) <= 4


def test_a_warning_made_an_error_after_the_workers_started_says_so():
    # the bare warning came out of the pool's receive, naming no step, and the next call
    # restarted every worker
    with _loader(2) as loader, warnings.catch_warnings():
        warnings.simplefilter("ignore", BlankImage)
        it = iter(loader)
        next(it)
        warnings.simplefilter("error", BlankImage)
        with pytest.raises(jl.WorkerError, match=r"worker \d warned BlankImage: record 1 blank "
                           r"\(.*test_relay.py:\d+\), which this process's warning filters "
                           r"make an error: .*set the filter before the loader is made"):
            list(it)


def test_a_filter_on_a_category_the_workers_cannot_import_starts_them(monkeypatch):
    # a plugin's warning class loaded by path: its module is not importable in a worker,
    # which died at its start unpickling the filter ("check memory use and native code")
    import sys
    import types

    module = types.ModuleType("a_plugin_by_path")  # (in sys.modules, as a path's import is)
    module.PluginWarning = plugin = type("PluginWarning", (UserWarning,),
                                         {"__module__": "a_plugin_by_path"})
    monkeypatch.setitem(sys.modules, "a_plugin_by_path", module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", plugin)
        warnings.simplefilter("error", BlankImage)
        with _loader(1) as loader, pytest.raises(jl.WorkerError, match="raised BlankImage"):
            list(loader)  # (the filters that follow it are the worker's still)


def test_a_warning_of_a_module_only_the_workers_import_meets_its_modules_filter(tmp_path,
                                                                                 monkeypatch):
    # the training process named its module by the file's path, so a filter on the module
    # did not match there: the warning was dropped, or (under "error") broke the loader
    (tmp_path / "decoder_only_in_workers.py").write_text(
        "import warnings\ndef decode(x):\n    warnings.warn(f'record {x} decoded with a "
        "fallback')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def decode(record):
        import decoder_only_in_workers

        if int(record["x"]) == 5:
            decoder_only_in_workers.decode(5)
        return record

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")
        warnings.filterwarnings("default", module="decoder_only_in_workers")
        with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4,
                           transforms=[jl.Map(decode)], num_workers=2, process_index=0,
                           process_count=1) as loader:
            assert len(list(loader)) == 2
    assert [str(w.message) for w in caught] == ["record 5 decoded with a fallback"]


def _decoded(record):
    log.info("record %d decoded", int(record["x"]))
    return record


def test_every_record_a_fast_transform_logs_is_handled_by_the_epochs_end(caplog):
    # a worker sent its records only while the pipe had room (a chunk at a time, before each
    # batch and every 0.1 s): 2,558 of 20,000 were handled, the rest printed on its stderr
    # at close() or dropped
    caplog.set_level(logging.INFO)
    with jl.DataLoader(jl.ArraySource({"x": np.arange(8000)}), batch_size=100,
                       transforms=[jl.Map(_decoded)], num_workers=2, process_index=0,
                       process_count=1) as loader:
        assert len(list(loader)) == 80
        handled = [r for r in caplog.records if r.name == "tests.augment"]
    assert len(handled) == 8000


def test_the_same_warning_of_two_files_is_shown_for_each(tmp_path, monkeypatch):
    # one registry for the loader, keyed by text and line: the second file's was hidden
    for name in ("plugin_a", "plugin_b"):
        (tmp_path / f"{name}.py").write_text(
            "import warnings\ndef use():\n    warnings.warn('size= is deprecated')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def both(record):
        import plugin_a
        import plugin_b

        plugin_a.use(), plugin_b.use()
        return record

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4,
                           transforms=[jl.Map(both)], num_workers=1, process_index=0,
                           process_count=1) as loader:
            list(loader)
    assert sorted(os.path.basename(w.filename) for w in caught) == ["plugin_a.py",
                                                                    "plugin_b.py"]


def _later(record):
    if int(record["x"]) == 15:  # (a thread's record after the worker's last batch)
        import threading
        import time

        threading.Thread(target=lambda: (time.sleep(0.3), log.warning(
            "record 15: the cache write failed"))).start()
    return record


def test_a_record_a_workers_thread_logs_after_its_last_batch_is_handled_at_close(caplog):
    # sent after the last batch, it waited in the pipe, and close() dropped it with what a
    # stopping worker leaves there: neither handled nor printed
    import time

    with jl.DataLoader(jl.ArraySource({"x": np.arange(16)}), batch_size=4,
                       transforms=[jl.Map(_later)], num_workers=2, process_index=0,
                       process_count=1) as loader:
        assert len(list(loader)) == 4
        time.sleep(1.0)
    assert "record 15: the cache write failed" in caplog.text


def test_a_workers_record_gets_the_trainers_record_factory_fields_and_a_failing_handler_is_said(
        capfd):
    # a format naming a field the trainer's factory adds ('%(rank)s') failed on every worker's
    # record ("Formatting field not found"); a handler that raised on one made next() raise it
    # bare, the workers started again each time and records logged twice (the warnings audit)
    made = logging.getLogRecordFactory()

    def with_rank(*args, **kwargs):
        record = made(*args, **kwargs)
        record.rank = 0
        record.msg = f"(r0) {record.msg}"  # (a prefix: the worker's records had none; the
        return record  # twenty-first review)

    seen: list[str] = []

    class Failing(logging.Handler):
        def emit(self, record):
            seen.append(self.format(record))
            if "record 11" in record.getMessage():
                raise ConnectionError("log server down")

    handler = Failing()
    handler.setFormatter(logging.Formatter("[rank %(rank)s] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    logging.setLogRecordFactory(with_rank)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BlankImage)
            with _loader(2) as loader:
                assert len(list(loader)) == 4
                assert loader._engine.restarts == 0
    finally:
        logging.setLogRecordFactory(made)
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)
    assert sorted(s for s in seen if "odd" in s) == [
        f"[rank 0] (r0) record {x} is odd" for x in (11, 19, 27, 3)]
    err = capfd.readouterr().err
    assert "--- Logging error (worker 1's record of" in err and "log server down" in err


def test_workers_stop_where_a_log_handler_raises_on_the_stopping_record():
    # the record was logged before the steps that stop the workers, none of which then ran:
    # each close() raised again and the workers lived on with the trainer (the warnings audit)
    class Rejecting(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("stopping worker"):
                raise RuntimeError("log sink rejected the record")

    jaxloader_log = logging.getLogger("jaxloader")
    handler, level = Rejecting(), jaxloader_log.level
    jaxloader_log.addHandler(handler)
    jaxloader_log.setLevel(logging.INFO)
    try:
        loader = jl.DataLoader(
            jl.ArraySource({"x": np.arange(32)}), batch_size=8, num_workers=2,
            process_index=0, process_count=1)
        pids = loader._engine.roster.pids
        list(loader)
        with pytest.raises(RuntimeError, match="log sink rejected"):
            loader.close()
    finally:
        jaxloader_log.removeHandler(handler)
        jaxloader_log.setLevel(level)
    assert not [p for p in pids if os.path.exists(f"/proc/{p}") and open(
        f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    loader.close()  # (done: nothing left to stop)


def test_a_module_that_warns_as_it_is_imported_starts_workers_made_under_error_after_it(
        tmp_path, monkeypatch):
    # imported first (its warning said), then warnings made errors for the run, as scripts do:
    # the workers' import of it raised that warning, "worker 0 raised while starting" (the
    # warnings audit)
    (tmp_path / "noisy_import.py").write_text(  # (jaxloader's own too: a source made on
        "import warnings, jaxloader as jl\nwarnings.warn('optional C extension not found')\n"
        "warnings.warn('files left out', jl.JaxloaderWarning)\n"  # import that warns; the
        "def double(r):\n    return {'x': r['x'] * 2}\n")  # twenty-first review)
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import noisy_import
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with jl.DataLoader(jl.ArraySource({"x": np.arange(16)}), batch_size=4, num_workers=2,
                           transforms=[jl.Map(noisy_import.double)], process_index=0,
                           process_count=1) as loader:
            assert [b["x"].tolist()[0] for b in loader] == [0, 8, 16, 24]


def test_what_a_worker_says_is_kept_where_its_relay_thread_cannot_start(monkeypatch):
    # at the process limit (ulimit -u) the relay's thread did not start, and the warning that
    # said so ended the worker: num_workers="auto" adding one there broke the run (the
    # process-model audit); what is kept goes with the next task's batches
    import threading

    kept = relay_worker._Kept()
    kept.conn = object()  # (a worker's pipe: only the thread's start is at stake here)

    def refused(thread):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", refused)
    kept.keep(["w", "UserWarning: one"], False)
    kept.keep(["w", "UserWarning: two"], False)
    assert [item[1] for item in kept.items] == ["UserWarning: one", "UserWarning: two"]
