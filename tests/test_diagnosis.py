"""Stage timings from every process that makes batches, and the verdict read from them: each
bottleneck injected on purpose gets its name (``loader.diagnose()``)."""

from __future__ import annotations

import os
import re
import sys
import time

import numpy as np
import pytest

import jaxloader as jl
from busy import WaitingSource, spin
from jaxloader.base.stats import LoaderStats, WorkerStats
from jaxloader.base.errors import WorkerError
from jaxloader.base.timings import Gauges, Timed, weight
from jaxloader.workers.tasks import Failure
from jaxloader.loaders.diagnosis import diagnose

ONE = {"process_index": 0, "process_count": 1}


def heavy(record):
    spin(0.0005)
    return record


def light(record):
    return record


def arrays(n=4096):
    return jl.ArraySource({"x": np.arange(n * 4, dtype=np.float32).reshape(n, 4)})


def run(loader, batches, step_s=0.0):
    with loader:
        for _, _batch in zip(range(batches), loader):
            if step_s:
                time.sleep(step_s)
        return loader.stats, loader.diagnose()


def test_a_light_source_under_a_slow_step_is_the_step():
    # (a step of 50 ms: under the suite's load the one worker waited up to 14 ms a batch for a
    # core, which a 20 ms step's read-ahead did not always cover)
    stats, d = run(jl.DataLoader(arrays(), batch_size=16, num_workers=1, **ONE), 25,
                   step_s=0.05)
    assert d.bottleneck == "step", str(d)
    assert "input keeps up" in d.advice[0]


def test_one_worker_and_a_cpu_heavy_transform_is_the_workers():
    stats, d = run(jl.DataLoader(arrays(), batch_size=16, transforms=[jl.Map(heavy)],
                                 num_workers=1, **ONE), 25)
    assert d.bottleneck == "workers", str(d)
    assert any("Map(heavy) takes" in line for line in d.advice), d.advice


def test_a_source_whose_reads_sleep_is_the_source_and_more_workers_than_cores_are_advised():
    stats, d = run(jl.DataLoader(WaitingSource(512), batch_size=8, num_workers=1, **ONE), 12)
    assert d.bottleneck == "source", str(d)
    assert "reads wait" in d.advice[0] and "more workers than cores" in d.advice[0]
    assert stats.workers[0].cpu_s < 0.5 * stats.workers[0].busy_s  # the waits are off the CPU


def test_loading_in_process_is_the_main_process():
    stats, d = run(jl.DataLoader(arrays(), batch_size=16, transforms=[jl.Map(heavy)], **ONE),
                   12)
    assert d.bottleneck == "main", str(d)
    assert "num_workers=0" in d.advice[0]
    assert stats.workers == () and stats.stages["Map(heavy)"] > 0


def _blurred(record):
    import jax
    import jax.numpy as jnp

    def blur(i, image):
        return (image + jnp.roll(image, 1, axis=0) + jnp.roll(image, 1, axis=1)) / 3

    return {"x": jax.lax.fori_loop(0, 400, blur, record["x"].astype(jnp.float32))}


def test_a_jitmaps_compiled_run_is_its_own_time_not_collation():
    # JAX returns before XLA's run ends; the wait fell in the copy of the chunk's output,
    # timed as collation: most of a slow JitMap's time was booked to "collate" (its time
    # 0.1-0.3x collation's here, 40-60x with the fix), and the advice stopped naming it
    source = jl.ArraySource({"x": np.ones((512, 64, 64, 3), np.uint8)})
    stats, d = run(jl.DataLoader(source, batch_size=32, transforms=[
        jl.JitMap(_blurred, chunk_bytes=2**18)], **ONE), 8)  # (8 chunks a batch)
    assert stats.stages["JitMap(_blurred)"] > 10 * stats.stages["collate"], stats.stages
    assert any("JitMap(_blurred) takes" in line for line in d.advice), d.advice


def _tanh(record):
    import jax.numpy as jnp

    return {"x": jnp.tanh(record["x"])}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_jitmaps_compilation_is_a_stage_of_its_own_not_a_batchs_cost(workers):
    # the first batch's trace and compilation were the JitMap's stage, its shares over the
    # clock's life: a JitMap of ~0.5 ms a batch was told as 26-114 ms a batch, 99% of the
    # loader's time, and 2 workers at a 10 ms step as busy all the time
    stats, d = run(jl.DataLoader(arrays(), batch_size=32, num_workers=workers,
                                 transforms=[jl.JitMap(_tanh)], **ONE), 24, step_s=0.005)
    assert stats.stages.get("JitMap(_tanh) compile", 0) > 0, stats.stages
    assert stats.stages["JitMap(_tanh)"] < stats.stages["JitMap(_tanh) compile"], stats.stages
    assert "JitMap(_tanh) compile" not in d.stages or "(once)" in str(d), str(d)
    assert not [line for line in d.advice if "compile" in line], d.advice


def test_of_three_transforms_the_advice_names_the_slow_one():
    def decode(record):
        spin(0.0004)
        return record

    stats, d = run(jl.DataLoader(arrays(), batch_size=16, num_workers=1, transforms=[
        jl.Map(light), jl.Map(decode), jl.RandomMap(lambda r, rng: r)], **ONE), 20)
    named = [line for line in d.advice if "of the workers' time" in line]
    assert len(named) == 1 and "Map(decode)" in named[0], d.advice
    shares = {k: v for k, v in stats.stages.items() if k.startswith(("Map", "RandomMap"))}
    assert max(shares, key=shares.__getitem__) == "Map(decode)" and len(shares) == 3
    assert "Map(decode)" in str(d)


@pytest.mark.parametrize("workers", [0, 2])
def test_stage_times_are_present_and_add_up(workers):
    loader = jl.DataLoader(arrays(), batch_size=32, transforms=[jl.Map(heavy)],
                           num_workers=workers, **ONE)
    stats, _ = run(loader, 30)
    assert stats.batches == 30 and stats.batches_made >= 30 and stats.records >= 30 * 32
    assert stats.bytes >= 30 * 32 * 16 and stats.wall_s > 0 and stats.batches_per_s > 0
    for stage in ("read", "Map(heavy)", "collate", "consumer wait"):
        assert stats.stages[stage] > 0, stage
    made = sum(v for k, v in stats.stages.items()
               if k not in ("hand-over", "placement", "consumer wait", "step"))
    assert made <= stats.wall_s * max(1, workers) * 1.05
    assert stats.num_workers == workers and len(stats.workers) == workers
    for w in stats.workers:
        assert w.batches > 0 and 0 < w.cpu_s <= w.busy_s * 1.1 + 0.01
        assert sum(w.stages.values()) <= w.busy_s * 1.05 + 0.005  # within its tasks' time
        assert w.busy_s <= stats.wall_s + 0.05
    if workers:
        assert stats.stages["hand-over"] > 0 and stats.ready_ahead >= 0
    loader.reset_stats()
    assert loader.stats.batches == 0 and loader.stats.stages.get("read", 0.0) == 0.0


def test_the_hand_over_is_the_timed_receipts_and_hand_outs_means_for_each_one():
    gauges = Gauges(1)
    gauges.receipts = 40  # (the pool counts them: 40 received, two of them timed below)
    gauges.received(1, 0.01, {})  # one of the first SAMPLE: it stands for itself
    gauges.received(16, 0.02, {})  # one in SAMPLE after those: it stands for 16
    assert gauges.hand_over_s(batches=100) == pytest.approx(40 * (0.01 + 16 * 0.02) / 17)
    assert gauges.ready_ahead() == 0.0
    gauges.handed_out(0.001, waiting=3)
    gauges.handed_out(0.003, waiting=1)
    assert gauges.hand_over_s(batches=100) == pytest.approx(
        40 * (0.01 + 16 * 0.02) / 17 + 100 * 0.002)
    assert gauges.ready_ahead() == 2.0
    gauges.receipts = 500
    gauges.reset()  # (a window's receipts are timed by weight() from its start)
    assert gauges.hand_over_s(batches=100) == 0.0 and gauges.receipts == 0


def test_timed_receipts_mark_each_time_the_next_batch_waiting_and_never_a_failure():
    gauges = Gauges(1)
    ready = {3: ("slot", "layout", [], None), 4: ("slot", "layout", [], None)}
    gauges.received(1, 0.25, ready)
    assert type(ready[3]) is Timed and ready[3] == ("slot", "layout", [], None)
    gauges.received(1, 0.25, ready)  # the next of those waiting, not the same one again
    assert type(ready[4]) is Timed and gauges.receipt_w == 2
    failure = Failure(WorkerError("worker 0 failed"), None)  # (a NamedTuple: a tuple too)
    ready = {5: failure}
    gauges.received(1, 0.25, ready)
    assert ready[5] is failure


def test_a_window_after_a_warm_up_times_its_receipts_from_its_start():
    loader = jl.DataLoader(arrays(1 << 14), batch_size=16, shuffle=True, num_epochs=None,
                           num_workers=2, **ONE)
    with loader:
        it = iter(loader)
        for _ in range(1000):  # many more than 16 receipts
            next(it)
        loader.reset_stats()
        for _ in range(100):
            next(it)
        stats, gauges = loader.stats, loader._engine.gauges
    assert stats.batches == 100 and stats.stages["hand-over"] > 0, stats.stages
    assert stats.ready_ahead > 0
    # The pool's test (inline, a call a receipt saved) is the rule of weight(), from the reset
    assert 0 < gauges.receipts and gauges.receipt_w == sum(
        weight(n) for n in range(1, gauges.receipts + 1))


def test_a_failed_call_counts_no_step_time_and_the_calls_after_it_count_theirs():
    failed = []

    def once(record):
        if record["x"][0] == 64 and not failed:  # step 2's first record, the first time
            failed.append(True)
            raise ValueError("once")
        return record

    loader = jl.DataLoader(arrays(), batch_size=8, transforms=[jl.Map(once)], **ONE)
    with loader:
        it = iter(loader)
        next(it)
        next(it)
        time.sleep(0.6)  # before the failed call, which records nothing
        with pytest.raises(jl.RecordError, match="once"):
            next(it)
        time.sleep(0.6)  # after it: not the consumer's step either
        next(it)
        time.sleep(0.2)  # counted
        next(it)
        stats = loader.stats
    assert stats.batches == 4 and 0.2 <= stats.run_s < 0.7, stats.run_s  # (0.9 if either were)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_loaders_stages_come_from_its_workers(workers):
    stream = jl.Stream.from_generator(lambda i: ({"x": np.float32(j)} for j in range(800)),
                                      shards=2)
    loader = jl.StreamLoader(stream, batch_size=8, transforms=[jl.Map(heavy)],
                             num_workers=workers, **ONE)
    stats, d = run(loader, 60)
    assert stats.stages["read"] > 0 and stats.stages["Map(heavy)"] > 0
    assert len(stats.workers) == workers and all(w.batches > 0 for w in stats.workers)
    assert d.bottleneck == ("main" if workers == 0 else "workers"), str(d)


def test_diagnose_needs_batches_and_says_so():
    with pytest.raises(jl.JaxloaderError, match="iterate a few batches first"):
        jl.DataLoader(arrays(), batch_size=4, **ONE).diagnose()
    empty = LoaderStats(batches=5, wait_s=0.0, run_s=1.0, wall_s=1.0)
    assert diagnose(empty, num_workers=0, cores=2).bottleneck == "step"
    # a window of one batch was said as "since the stats began" (11 had been; the audit)
    with jl.DataLoader(arrays(), batch_size=4, num_epochs=None, **ONE) as loader:
        batches = iter(loader)
        for _ in range(10):
            next(batches)
        earlier = loader.stats
        next(batches)
        with pytest.raises(jl.JaxloaderError, match=r"1 batch\(es\) handed out in the window "
                                                    r"since the stats given"):
            loader.diagnose(since=earlier)


def test_placement_is_timed_where_a_sharding_places_the_batches():
    import jax

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    loader = jl.DataLoader(arrays(), batch_size=8 * jax.device_count(),
                           sharding=jl.data_sharding(mesh, "data"), **ONE)
    stats, _ = run(loader, 10)
    assert stats.stages["placement"] > 0


def test_the_log_says_what_the_workers_do_and_a_periodic_summary_with_the_verdict(caplog):
    caplog.set_level("INFO", logger="jaxloader")
    loader = jl.DataLoader(arrays(), batch_size=16, transforms=[jl.Map(heavy)], num_workers=1,
                           log_every_s=0.2, **ONE)
    run(loader, 60)
    said = [r.getMessage() for r in caplog.records if r.name == "jaxloader"]
    assert any("started 1 worker process" in m for m in said), said
    assert any("stopping worker process" in m for m in said), said  # close()
    summaries = [m for m in said if "bottleneck: workers" in m]
    assert summaries and "batches/s" in summaries[0], said
    # (a window under 10 s to a tenth: "14 batches in 0 s, 32.8 batches/s" was said)
    assert re.search(r"batches in 0\.[1-9] s", summaries[0]), summaries[0]


def slow_early(record):
    if record["x"][0] < 4 * 16 * 30:  # the first 30 batches of 16 (shuffle off)
        spin(0.002)
    return record


def test_the_periodic_summary_judges_the_input_since_the_summary_before(caplog):
    # the summary judged every batch since the loader was made: a slow first stretch was named
    # the bottleneck for the rest of the run, long after the loop itself had become the limit
    caplog.set_level("INFO", logger="jaxloader")
    loader = jl.DataLoader(arrays(), batch_size=16, transforms=[jl.Map(slow_early)],
                           num_workers=1, log_every_s=3600, **ONE)
    with loader:
        it = iter(loader)
        for _ in range(30):
            next(it)
        assert "bottleneck: workers" in loader._summary()
        earlier = loader.stats
        for _ in range(30):
            next(it)
            time.sleep(0.01)
        line = loader._summary()
        assert loader.diagnose().bottleneck == "workers"  # the totals still say so
        assert loader.diagnose(since=earlier).bottleneck == "step"
    assert "bottleneck: step" in line and line.startswith("30 batches in "), line
    assert line.endswith("(60 batches since the stats began)"), line


def test_a_window_of_stats_is_the_difference_of_two_reads():
    w0 = WorkerStats(0, 7, 10, 40, 400, 2.0, 1.5, {"read": 1.0}, 0.25)
    earlier = LoaderStats(10, 3.0, 1.0, 4.0, 40, 400, {"read": 1.0, "step": 1.0}, (w0,), 1,
                          2.0, 10, 0.5)
    w1 = w0._replace(batches=30, records=120, bytes=1200, busy_s=3.0, cpu_s=2.0,
                     stages={"read": 1.5, "Map(f)": 0.5}, queued_s=0.5)
    new = WorkerStats(1, 8, 5, 20, 200, 1.0, 1.0, {"read": 0.2})  # started in the window
    later = LoaderStats(30, 3.5, 5.0, 9.5, 160, 1600, {"read": 1.7, "step": 5.0}, (w1, new), 2,
                        1.0, 35, 0.5)
    window = later.since(earlier)
    assert (window.batches, window.wait_s, window.run_s, window.wall_s) == (20, 0.5, 4.0, 5.5)
    assert (window.records, window.bytes, window.batches_made) == (120, 1200, 25)
    assert dict(window.stages) == pytest.approx({"read": 0.7, "step": 4.0})
    assert window.first_batch_s == 0.0 and window.num_workers == 2
    assert window.ready_ahead == pytest.approx((1.0 * 30 - 2.0 * 10) / 20)
    first, second = window.workers
    assert (first.batches, first.busy_s, first.cpu_s, first.queued_s) == (20, 1.0, 0.5, 0.25)
    assert dict(first.stages) == pytest.approx({"read": 0.5, "Map(f)": 0.5})
    assert second == new
    # the two swapped returned the earlier whole, as if counts had gone back (a reset_stats()
    # changes began: that is its sign; the profiling audit)
    with pytest.raises(jl.ConfigError, match=r"earlier holds 30 batches, these 10: it was read "
                                             r"later; call later.since\(earlier\)"):
        earlier.since(later)
    assert later.since(LoaderStats(0, 0.0, 0.0)).first_batch_s == 0.5
    assert window.batches_per_s == pytest.approx(20 / 5.5)  # (a window: no first batch)
    # read across a reset_stats() whose counts have since grown past the earlier ones: the
    # counts since the reset, not a difference across it (negative times, a rate below 0)
    assert later._replace(began=2.0).since(earlier._replace(began=1.0)).batches == 30


def test_two_loaders_log_lines_say_which_loader_each_is(caplog):
    # a train and an eval loader logging side by side: no line said which loader it was of
    caplog.set_level("INFO", logger="jaxloader")
    train = jl.DataLoader(arrays(), batch_size=16, num_epochs=None, log_every_s=0.01, **ONE)
    evaluate = jl.DataLoader([{"x": np.float32(i)} for i in range(64)], batch_size=8,
                             num_epochs=None, log_every_s=0.01, **ONE)
    with train, evaluate:
        its = iter(train), iter(evaluate)
        for _ in range(6):
            for it in its:
                next(it)
                time.sleep(0.005)
    said = [r.getMessage() for r in caplog.records if "batches/s" in r.getMessage()]
    named = {m.split(": ", 1)[0] for m in said}
    assert len(named) == 2, said
    assert {name.split(" (", 1)[1] for name in named} == {"ArraySource, batch_size 16)",
                                                          "list, batch_size 8)"}, named


def test_the_log_is_silent_by_default(capfd):
    run(jl.DataLoader(arrays(), batch_size=16, num_workers=1, log_every_s=0.05, **ONE), 20)
    assert capfd.readouterr().err == ""  # INFO records reach no handler unless one is set


def test_profile_runs_each_count_and_draws_the_timeline(tmp_path):
    def make(num_workers):
        return jl.DataLoader(arrays(), batch_size=16, transforms=[jl.Map(heavy)],
                             num_workers=num_workers, num_epochs=None, **ONE)

    import matplotlib

    backend = matplotlib.get_backend()  # (it was set to Agg: a notebook's inline plots gone)
    matplotlib.use("svg")
    out = tmp_path / "profile.png"
    try:
        report = jl.profile(make, steps=30, workers=(0, 1), out=str(out))
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(backend)
    assert [r.workers for r in report.runs] == [0, 1]
    assert report.runs[1].diagnosis.bottleneck == "workers"
    assert any(report.runs[1].trace[0]) and out.read_bytes()[:4] == b"\x89PNG"
    assert report._repr_png_() == out.read_bytes() and "the fastest" in str(report)


def test_time_between_passes_is_in_no_stage_nor_the_wall():
    # an evaluation between epochs counted in the wall, in no stage: batches/s and the
    # workers' busy share fell, and the verdict blamed the prefetch
    with jl.DataLoader(arrays(64), batch_size=8, **ONE) as loader:
        for _ in range(2):
            list(loader)
            time.sleep(0.5)
        stats = loader.stats
    assert stats.batches == 16 and stats.wall_s < 0.4, stats


def test_profile_does_not_advise_a_worker_count_it_measured_slower():
    # cheap batches at num_workers=0: "num_workers=2 makes them in parallel, expected ~2.1x"
    # under a table where 2 workers had run at 0.6x (the hand-over's cost is a floor)
    from jaxloader.loaders.diagnosis import Diagnosis
    from jaxloader.profiling import Profile, Run

    advised = ("batches are made in the training process (num_workers=0): num_workers=2 "
               "makes them in parallel, expected ~2.1x", "num_workers=8 reads more at once")
    runs = [Run(0, 13_500.0, Diagnosis("main", {"read": 1.0}, advised, 300), []),
            Run(2, 8_100.0, Diagnosis("main", {"read": 1.0}, (), 300), [])]
    said = str(Profile(runs, None, "p.png"))
    assert "expected ~2.1x" not in said.split("advised, from the stage times")[0], said
    assert "num_workers=2 ran here at 8100.0 batches/s, 0.60x num_workers=0's" in said, said
    assert "  - num_workers=8 reads more at once" in said  # (a count not run: as advised)


def test_a_notebook_shows_a_diagnosis_and_a_profile_as_their_tables(monkeypatch, capsys):
    # a cell ending in loader.diagnose() showed Diagnosis(bottleneck='source', stages=...),
    # and one ending in jl.profile(...) the picture alone, or <Profile at 0x...> without one
    from IPython.lib.pretty import pretty

    from jaxloader.loaders.diagnosis import Diagnosis
    from jaxloader.profiling import Profile, Run

    found = Diagnosis("workers", {"read": 0.1, "Map(decode)": 0.9}, ("num_workers=4",), 10)
    assert pretty(found) == str(found) and str(found).startswith("input bottleneck: workers")
    for png in (b"\x89PNG picture", None):
        report = Profile([Run(1, 100.0, found, [])], png, None)
        assert pretty(report) == str(report)
        pictures = []
        monkeypatch.setattr("IPython.display.display", pictures.append)
        report._ipython_display_()
        shown = capsys.readouterr().out
        assert shown == str(report) + "\n" and "the fastest: num_workers=1" in shown
        assert [p.data for p in pictures] == ([png] if png else [])
    assert "no picture: matplotlib is not installed" in shown


def test_profile_leaves_a_loader_of_yours_where_it_was_and_names_one_that_runs_out():
    # it closed the caller's loader, 20 batches on; one that ran out: a bare StopIteration
    with jl.DataLoader(arrays(), batch_size=8, num_epochs=None, **ONE) as loader:
        it = iter(loader)
        next(it), next(it)
        jl.profile(loader, steps=20, out=None)
        assert next(iter(loader))["x"][0, 0] == 16 * 4  # step 2's first record: where it was
    with jl.DataLoader(arrays(64), batch_size=8, **ONE) as short:  # one epoch: 8 batches
        with pytest.raises(jl.ConfigError, match=r"ran out after 8 batches, of steps=20; .*"
                                                 r"num_epochs=None \(endless\), or pass steps=8 "
                                                 r"or fewer$"):
            jl.profile(short, steps=20, out=None)
    with jl.DataLoader(arrays(16), batch_size=8, **ONE) as shorter:  # (fewer than profile's 3)
        with pytest.raises(jl.ConfigError, match=r"ran out after 2 batches.*\(endless\)$"):
            jl.profile(shorter, steps=20, out=None)


def _slow_record(record):
    time.sleep(0.001)
    return record


def test_profile_of_a_loader_of_yours_is_its_run_alone_and_leaves_no_batch_in_your_stats():
    # the batches before the profile were in its rate and verdict, and its batches in yours
    # (batches of 1 ms of work, not 0.3: a loaded machine's pause in the profile's own loop
    # outweighed those, and the verdict was "step", 1 in a full run beside other jobs)
    with jl.DataLoader(arrays(), batch_size=8, num_epochs=None, transforms=[_slow_record],
                       **ONE) as loader:
        for _, _batch in zip(range(6), loader):
            time.sleep(0.05)
        report = jl.profile(loader, steps=20, out=None)
        assert report.best.diagnosis.batches == 20, report.best.diagnosis
        assert report.best.diagnosis.bottleneck != "step", report.best.diagnosis
        assert loader.stats.batches == 0


def test_profile_says_an_unwritable_folder_first_and_keeps_the_picture_a_full_disk_refused(
        tmp_path, monkeypatch):
    # a read-only folder was found after every run, the report lost; a full disk left a cut
    # picture in place of the last one, the report lost too (the disk-full audit)
    def make(num_workers):
        return jl.DataLoader(arrays(), batch_size=8, num_workers=num_workers,
                             num_epochs=None, **ONE)

    out = tmp_path / "p.png"
    out.write_bytes(b"the last picture")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(
        tmp_path) else real_access(path, mode))
    with pytest.raises(jl.ConfigError, match="its folder cannot be written"):
        jl.profile(make, steps=5, workers=(0,), out=out)
    monkeypatch.setattr(os, "access", real_access)

    def full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", full)
    with pytest.warns(jl.JaxloaderWarning, match=r"could not be written \(No space left on "
                                                 r"device\); it is kept in memory"):
        report = jl.profile(make, steps=5, workers=(0,), out=out)
    assert report.png[:4] == b"\x89PNG" and report.path is None
    assert os.listdir(tmp_path) == ["p.png"] and out.read_bytes() == b"the last picture"
    monkeypatch.undo()  # (a link is written through, the file's mode kept: the twenty-first
    os.chmod(out, 0o664)  # review)
    (tmp_path / "latest.png").symlink_to("p.png")
    jl.profile(make, steps=5, workers=(0,), out=tmp_path / "latest.png")
    assert (tmp_path / "latest.png").is_symlink() and out.read_bytes()[:4] == b"\x89PNG"
    assert os.stat(out).st_mode & 0o777 == 0o664


def test_profile_names_worker_counts_it_cannot_try_and_what_is_not_a_loader():
    def make(num_workers):
        return jl.DataLoader(arrays(), batch_size=8, num_workers=num_workers,
                             num_epochs=None, **ONE)

    with make(0) as loader:  # (workers= was ignored for a loader)
        with pytest.raises(jl.ConfigError, match=r"workers=\(0, 1\)\) with a loader: .*"
                                                 r"pass make_loader"):
            jl.profile(loader, steps=5, workers=(0, 1), out=None)
    with pytest.raises(jl.ConfigError, match=r"expected a list of worker counts of 0 or more, "
                                             r"got \(\)"):
        jl.profile(make, steps=5, workers=(), out=None)  # (max() of nothing)
    assert [r.workers for r in jl.profile(make, steps=5, workers=np.arange(1), out=None).runs
            ] == [0]  # (a config's NumPy counts were refused: the config audit)
    with pytest.raises(jl.ConfigError, match=r"'<lambda>'\(num_workers=0\) returned int"):
        jl.profile(lambda num_workers: 5, steps=5, workers=(0,), out=None)
    with pytest.raises(jl.ConfigError, match=r"its folder does not exist"):
        jl.profile(make, steps=5, workers=(0,), out="/no/such/folder/p.png")

    def grain_named(num_workers):  # (its own TypeError, whose remedy names num_workers=: was
        return jl.DataLoader(np.arange(8), batch_size=2, worker_count=2)  # "takes no ...")
    with pytest.raises(TypeError, match=r"DataLoader has no worker_count: use num_workers=") \
            as raised:
        jl.profile(grain_named, steps=5, workers=(0,), out=None)
    assert "takes no num_workers" not in str(raised.value)
    import functools  # (a decorator's wrapper takes num_workers=, the function it wraps not:

    def adapted(inner):  # profiled as before, the review found it refused)
        @functools.wraps(inner)
        def wrapper(num_workers):
            return inner()
        return wrapper

    assert [r.workers for r in jl.profile(adapted(lambda: make(0)), steps=5, workers=(0,),
                                          out=None).runs] == [0]

    def logged(inner):  # (a wrapper of *args, **kwargs says nothing: the wrapped one's told)
        @functools.wraps(inner)
        def wrapper(*args, **kwargs):
            return inner(*args, **kwargs)
        return wrapper

    with pytest.raises(jl.ConfigError, match=r"'<lambda>' takes no num_workers="):
        jl.profile(logged(lambda: make(0)), steps=5, workers=(0,), out=None)


@pytest.mark.parametrize("argv, said", [
    (["no_such_module_x:make"], "no module 'no_such_module_x' to import"),
    (["jaxloader:no_such_name"], "'jaxloader' has no 'no_such_name'; its functions: "),
    (["no/such/file.py:make"], "cannot import 'no/such/file.py' (no such Python file)"),
    (["jaxloader.profiling:cores_available"], "takes no num_workers="),
    (["x:make", "--workers", "a,b"], "argument --workers: expected counts like 0,1,2,4"),
])
def test_the_profile_command_names_a_bad_argument_without_a_traceback(argv, said, capsys):
    from jaxloader.profiling import main

    with pytest.raises(SystemExit) as exited:  # (each was a traceback of an internal error)
        main(argv)
    assert exited.value.code == 2 and said in capsys.readouterr().err


def test_the_profile_commands_file_imports_the_modules_beside_it(tmp_path, monkeypatch):
    # `python train.py` finds train.py's own modules; `python -m jaxloader.profile
    # train.py:make` did not: a bare ModuleNotFoundError (the env audit)
    from jaxloader.profiling import _factory

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "_profiled", None)  # (put back after)
    (tmp_path / "beside_profiled_x.py").write_text("SIZE = 3\n")
    (tmp_path / "train_cfg.py").write_text("import beside_profiled_x\n\n\n"
                                           "def make():\n    return beside_profiled_x.SIZE\n")
    monkeypatch.delitem(sys.modules, "beside_profiled_x", raising=False)
    assert _factory(f"{tmp_path}/train_cfg.py:make")() == 3
    assert sys.path[0] == str(tmp_path)
    # run from the module's own folder in safe-path mode: "run from the folder that holds
    # it" alone, where the user was
    import subprocess

    done = subprocess.run([sys.executable, "-P", "-m", "jaxloader.profile", "train_cfg:make"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 2 and "no module 'train_cfg' to import" in done.stderr and \
        "safe-path mode, PYTHONSAFEPATH or -P: the folder it runs from is not on sys.path; " \
        "PYTHONPATH=. puts it there" in done.stderr, done.stderr


def test_copies_to_the_device_while_the_workers_idle_are_the_device():
    from jaxloader.base.stats import WorkerStats

    idle = WorkerStats(0, 1, 100, 3200, 1 << 20, busy_s=0.3, cpu_s=0.3,
                       stages={"read": 0.1, "collate": 0.2})
    stats = LoaderStats(batches=100, wait_s=2.0, run_s=1.0, wall_s=3.0, batches_made=100,
                        stages={"read": 0.1, "collate": 0.2, "hand-over": 0.01,
                                "placement": 1.8, "consumer wait": 2.0, "step": 1.0},
                        workers=(idle,))
    d = diagnose(stats, num_workers=1, cores=4)
    assert d.bottleneck == "device" and "device placement takes 18.0 ms a batch" in d.advice[0]


def test_placement_in_process_gets_its_advice():
    # num_workers=0 and the device the bottleneck: the advice was "none"
    stats = LoaderStats(batches=100, wait_s=2.0, run_s=1.0, wall_s=3.0, batches_made=100,
                        stages={"read": 0.1, "collate": 0.2, "placement": 1.8,
                                "consumer wait": 2.0, "step": 1.0})
    d = diagnose(stats, num_workers=0, cores=4)
    assert d.bottleneck == "device" and d.advice, d
    assert "placement takes 18.0 ms a batch" in d.advice[0] and "device_prefetch=" in d.advice[0]
    assert "on a thread" in d.advice[0]
    # several devices' copies are made in the training thread: a deeper prefetch overlaps
    # them with the steps on an accelerator only (it was advised as copies "on a thread")
    d = diagnose(stats, num_workers=0, cores=4, placed_in_thread=False)
    assert "on a thread" not in d.advice[0] and "on an accelerator a larger device_prefetch=" \
        in d.advice[0], d.advice


def test_transforms_waiting_off_the_cpu_get_more_workers_than_cores_a_count_the_loader_takes():
    # a Map waiting on files: "every core is in use", while the workers' CPUs idled; and a
    # stream's advice named a count its readers refuse (6 readers: 1, 2, 3 or 6 workers)
    from jaxloader.base.stats import WorkerStats

    waiting = [WorkerStats(i, 1, 50, 800, 1 << 20, busy_s=2.9, cpu_s=0.1,
                           stages={"read": 0.1, "Map(fetch)": 2.8}) for i in range(2)]
    stats = LoaderStats(batches=100, wait_s=2.5, run_s=0.5, wall_s=3.0, batches_made=100,
                        records=1600, stages={"read": 0.2, "Map(fetch)": 5.6, "collate": 0.1,
                                              "consumer wait": 2.5, "step": 0.5},
                        workers=tuple(waiting))
    d = diagnose(stats, num_workers=2, cores=2)
    assert d.bottleneck == "workers" and "the transforms wait" in d.advice[0], d
    assert "num_workers=4" in d.advice[0], d
    d = diagnose(stats, num_workers=2, cores=2, counts=[1, 2, 3, 6])
    assert "num_workers=3" in d.advice[0], d


def test_waiting_for_a_core_is_not_taken_for_reads_waiting_and_parked_workers_not_for_idle():
    from jaxloader.base.stats import WorkerStats

    # two workers on one core: half their busy time queued for it, which the advice took for
    # reads waiting on storage ("more workers than cores")
    queued = tuple(WorkerStats(i, 1, 50, 800, 1 << 20, busy_s=2.9, cpu_s=1.45, queued_s=1.4,
                               stages={"read": 2.8, "collate": 0.1}) for i in range(2))
    stats = LoaderStats(batches=100, wait_s=2.5, run_s=0.5, wall_s=3.0, batches_made=100,
                        records=1600, stages={"read": 5.6, "collate": 0.2,
                                              "consumer wait": 2.5, "step": 0.5},
                        workers=queued, num_workers=2)
    d = diagnose(stats, num_workers=2, cores=1)
    assert d.bottleneck == "source" and not any("off the CPU" in a for a in d.advice), d
    # autotune went from 4 workers to 1, busy all the time: the 3 parked ones, busy earlier or
    # never, were averaged in (42% busy: "they wait for tasks")
    parked = tuple(WorkerStats(i, 1, 10, 160, 1 << 20, busy_s=b, cpu_s=b,
                               stages={"Map(f)": b}) for i, b in enumerate((3.0, 2.0, 0, 0)))
    stats = LoaderStats(batches=100, wait_s=2.5, run_s=0.5, wall_s=3.0, batches_made=100,
                        records=1600, stages={"Map(f)": 5.0, "consumer wait": 2.5, "step": 0.5},
                        workers=parked, num_workers=1)
    d = diagnose(stats, num_workers=1, cores=1)
    assert d.bottleneck == "workers" and "busy only" not in str(d), d


def test_workers_autotune_started_late_are_judged_by_their_own_time_in_use():
    # autotune grew 1 -> 8 workers, each busy all its time since it started: shares of the
    # whole run (1.0, 0.5, 0.25...) read "busy only 41%: they wait for tasks (a larger
    # prefetch= helps)", where more workers or read_threads would (the diagnosis audit)
    from jaxloader.base.stats import WorkerStats

    joined = (3.0, 1.5, 0.75, 0.75, 0.375, 0.375, 0.375, 0.375)
    workers = tuple(WorkerStats(i, 1, 10, 80, 1 << 20, busy_s=t, cpu_s=0.05 * t, in_use_s=t,
                                stages={"read": t}) for i, t in enumerate(joined))
    stats = LoaderStats(batches=100, wait_s=2.5, run_s=0.5, wall_s=3.0, batches_made=100,
                        records=800, stages={"read": sum(joined), "consumer wait": 2.5,
                                             "step": 0.5}, workers=workers, num_workers=8)
    assert stats.busy == (1.0,) * 8
    d = diagnose(stats, num_workers=8, cores=2)
    assert d.bottleneck == "source" and "busy only" not in str(d), d
    assert "reads wait" in d.advice[0] and "num_workers=16" in d.advice[0], d
    # a worker parked before the window (0 s in use) is no idle one
    parked = stats._replace(workers=(*workers[:2], workers[2]._replace(busy_s=0.0, in_use_s=0.0)))
    assert "busy only" not in str(diagnose(parked._replace(num_workers=2), num_workers=2, cores=2))
    later = stats._replace(workers=tuple(w._replace(busy_s=2 * w.busy_s, in_use_s=2 * w.in_use_s)
                                         for w in workers), batches=200)
    assert [w.in_use_s for w in later.since(stats).workers] == list(joined)
    began = time.perf_counter()
    with jl.DataLoader(arrays(), batch_size=16, num_workers=2, **ONE) as loader:
        list(loader)
        assert all(0 < w.in_use_s <= time.perf_counter() - began for w in loader.stats.workers)


def test_cores_taken_by_other_processes_are_not_advised_as_idle():
    # one worker of this loader and one of another on 2 cores: "1 of 2 cores idle:
    # num_workers=2, expected ~1.9x" (1.07x when followed), while the worker had waited for
    # a core most of its busy time
    from jaxloader.base.stats import WorkerStats

    worker = WorkerStats(0, 1, 100, 1600, 1 << 20, busy_s=2.9, cpu_s=1.0, queued_s=1.8,
                         stages={"Map(f)": 2.8, "collate": 0.1})
    stats = LoaderStats(batches=100, wait_s=2.5, run_s=0.5, wall_s=3.0, batches_made=100,
                        records=1600, stages={"Map(f)": 2.8, "collate": 0.1,
                                              "consumer wait": 2.5, "step": 0.5},
                        workers=(worker,), num_workers=1)
    d = diagnose(stats, num_workers=1, cores=2)
    assert d.bottleneck == "workers" and "waited for a core 62%" in d.advice[0], d
    assert not any("idle" in a for a in d.advice), d
    alone = stats._replace(workers=(worker._replace(cpu_s=2.8, queued_s=0.0),))
    assert "1 of 2 cores idle" in diagnose(alone, num_workers=1, cores=2).advice[0]
    # Ray actors (their queueing measured where they run): their nodes' cores are full, not
    # "the transforms wait (files, the network, sleeps, locks)", nor "more of them"
    d = diagnose(stats, num_workers=1, cores=2, remote=True)
    assert d.advice[0].startswith("the Ray actors waited for a core 62% of their busy time: "
                                  "their nodes' cores are taken"), d
    assert not any("RayWorkers(n=" in a for a in d.advice), d
    # an actor lost: three actors' shares over the two in use were "busy" above 100%
    three = tuple(worker._replace(worker=i, busy_s=2.5, cpu_s=2.5, queued_s=0.0)
                  for i in range(3))
    lost = stats._replace(workers=three, num_workers=2)
    assert "busy 100% of the time" in str(diagnose(lost, num_workers=2, cores=8, remote=True))


def test_the_stats_give_each_workers_time_waiting_for_a_core():
    with jl.DataLoader(arrays(), batch_size=16, transforms=[jl.Map(heavy)], num_workers=2,
                       **ONE) as loader:
        list(loader)
        workers = loader.stats.workers
        loader.reset_stats()
        assert len(workers) == 2 and all(w.queued_s >= 0.0 for w in workers), workers
        assert all(w.queued_s < 0.05 for w in loader.stats.workers)  # (~none since the reset)


def _asleep(record):
    time.sleep(0.004)  # (off the CPU: a task's time a wait for a core may be)
    return record


def test_the_workers_wait_for_a_core_is_kept_in_the_stats_after_close(tmp_path, monkeypatch):
    # read from their processes, which close() ends: the stats after it said 0 for each
    from jaxloader.base import stats

    monkeypatch.setattr(stats, "_PROC", str(tmp_path), raising=False)
    loader = jl.DataLoader(arrays(128), batch_size=16, transforms=[jl.Map(_asleep)],
                           num_workers=2, **ONE)
    list(loader)
    for pid in loader.worker_pids:  # (as Linux would count it: 50 ms each)
        folder = tmp_path / str(pid) / "task" / str(pid)
        folder.mkdir(parents=True)
        (folder / "schedstat").write_text("910 50000000 4\n")
    loader.close()
    for pid in loader.worker_pids or [w.pid for w in loader.stats.workers]:
        (tmp_path / str(pid) / "task" / str(pid) / "schedstat").unlink()  # (the process gone)
    assert [w.queued_s for w in loader.stats.workers] == pytest.approx([0.05, 0.05])


def test_a_workers_wait_for_a_core_is_every_threads(tmp_path, monkeypatch):
    # the main thread's alone: a JitMap's task waits off the CPU for XLA's threads, which
    # wait for a core, and the verdict said "the transforms wait (files, sleeps, locks)"
    from jaxloader.base import stats

    for thread, waited in ((7, 2_000_000_000), (8, 5_000_000_000), (9, None)):
        folder = tmp_path / "7" / "task" / str(thread)
        folder.mkdir(parents=True)
        (folder / "schedstat").write_text("1 2 3" if waited is None else f"910 {waited} 4\n")
    (tmp_path / "7" / "schedstat").write_text("910 2000000000 4\n")  # (the main thread's)
    monkeypatch.setattr(stats, "_PROC", str(tmp_path), raising=False)
    assert stats.queued_s(7) == pytest.approx(2 + 5 + 2e-9)
    assert stats.queued_s(8) == 0.0  # (no such process)


def test_ray_actors_are_advised_as_actors_and_each_keeps_its_own_pid_in_the_stats():
    from jaxloader.base.stats import WorkerStats

    # "1 of 2 cores idle: num_workers=2": this machine's cores, and a count Ray loaders refuse
    busy = tuple(WorkerStats(i, 1, 50, 800, 1 << 20, busy_s=2.9, cpu_s=2.9,
                             stages={"Map(f)": 2.9}) for i in range(2))
    stats = LoaderStats(batches=100, wait_s=2.5, run_s=0.5, wall_s=3.0, batches_made=100,
                        records=1600, stages={"Map(f)": 5.8, "consumer wait": 2.5, "step": 0.5},
                        workers=busy, num_workers=2)
    advice = " ".join(diagnose(stats, num_workers=2, cores=8, remote=True).advice)
    assert "RayWorkers(n=4)" in advice and "num_workers" not in advice, advice
    # waits off the CPU: more actors, each of a share of the CPUs the two take (RayWorkers(n=4)
    # of 1 CPU each could not start on the 2-CPU cluster it was said of: the Ray audit)
    waiting = tuple(w._replace(cpu_s=0.3) for w in busy)
    stats_waiting = stats._replace(workers=waiting)
    advice = " ".join(diagnose(stats_waiting, num_workers=2, cores=8, remote=True,
                               actor_cpus=1.0).advice)
    assert "off the CPU: more workers than cores overlap the waits: RayWorkers(n=4, " \
        "num_cpus=0.5)" in advice, advice
    advice = " ".join(diagnose(stats_waiting, num_workers=2, cores=8, remote=True,
                               actor_cpus=1.0, counts=[3]).advice)  # (2 CPUs over 3, rounded
    assert "RayWorkers(n=3, num_cpus=0.666)" in advice, advice  # down: 3 x 0.667 > 2)
    # a stream of 2 readers on 2 actors takes no more: it was told RayWorkers(n=2), the count
    # it had (the Ray streams audit)
    advice = " ".join(diagnose(stats, num_workers=2, cores=8, remote=True,
                               counts=[1, 2]).advice)
    assert "RayWorkers(n=2)" not in advice and "readers_per_process=4 and RayWorkers(n=4)" in \
        advice, advice

    class Engine:  # a Ray engine whose actor 0 is gone: the stats named actor 1's pid for it
        remote, active, pids, maker_pids = True, 2, [202, 303], [101, 202, 303]
        gauges = Gauges(3)

    with jl.DataLoader(arrays(), batch_size=8, **ONE) as loader:
        engine, loader._engine = loader._engine, Engine()
        try:
            assert [w.pid for w in loader.stats.workers] == [101, 202, 303]
        finally:
            loader._engine = engine


def test_the_table_gives_a_makers_stage_a_batch_made_and_the_main_ones_a_batch_handed_out():
    # 4 batches handed out, 20 made ahead: a maker's stage was divided by 4 (5x its cost)
    stats = LoaderStats(batches=4, wait_s=0.001, run_s=2.0, wall_s=2.0, batches_made=20,
                        stages={"Map(slow)": 0.08, "consumer wait": 0.001, "step": 2.0},
                        workers=())
    table = str(diagnose(stats, num_workers=1, cores=4))
    assert "Map(slow)                   0.080         4.0" in table, table
    assert "step                        2.000       500.0" in table, table


def test_a_peek_is_no_batch_of_the_stats():
    # in process a peek was counted: 3 peeks and 5 batches said 8 made
    with jl.DataLoader(arrays(), batch_size=4, **ONE) as loader:
        for _ in range(3):
            loader.peek()
        it = iter(loader)
        for _ in range(5):
            next(it)
        stats = loader.stats
    assert (stats.batches, stats.batches_made, stats.records) == (5, 5, 20)
    # nor does it take the batches a device thread makes meanwhile off the stats
    import jax

    def slow(r):
        time.sleep(0.001)
        return r
    with jl.DataLoader(arrays(), batch_size=4, transforms=[jl.Map(slow)], num_epochs=None,
                       sharding=jax.devices()[0], device_prefetch=4, **ONE) as loader:
        it = iter(loader)
        for _ in range(20):
            next(it)
            loader.peek(), loader.peek()
        stats = loader.stats
    assert stats.batches_made >= stats.batches == 20, stats


def test_a_pause_before_reset_stats_is_not_step_time_of_the_window():
    # the gap before the reset (an evaluation, a checkpoint) was counted as the consumer's step
    # time of the new window: run_s over wall_s, and an input-bound loop judged "input keeps up"
    with jl.DataLoader(arrays(256), batch_size=16, num_epochs=None, **ONE) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        time.sleep(0.5)
        loader.reset_stats()
        for _ in range(5):
            next(it)
        stats = loader.stats
    assert stats.run_s <= stats.wall_s < 0.5, (stats.run_s, stats.wall_s)


def test_the_advice_counts_what_workers_cost_and_the_cores_a_worker_already_uses():
    from jaxloader.base.stats import WorkerStats

    # in process, 30 us a batch: "num_workers=2 makes them in parallel, expected ~2.0x", where
    # workers' hand-over alone costs ~35 us a batch (they ran at 0.5-0.8x)
    light = LoaderStats(batches=1000, wait_s=0.03, run_s=0.003, wall_s=0.033, batches_made=1000,
                        records=16000, stages={"read": 0.02, "collate": 0.01,
                                               "consumer wait": 0.03, "step": 0.003})
    d = diagnose(light, num_workers=0, cores=2)
    assert d.bottleneck == "main" and "workers would not make them much sooner" in d.advice[0]
    assert not any("num_workers=2" in a for a in d.advice), d
    # ... and with workers, batches made ahead and the loop waiting 35 us for each: the verdict
    # blamed the source and advised a larger prefetch
    ahead = tuple(WorkerStats(i, 1, 5000, 80000, 1 << 20, busy_s=0.3, cpu_s=0.3,
                              stages={"read": 0.2, "collate": 0.1}) for i in range(2))
    fast = LoaderStats(batches=10000, wait_s=0.35, run_s=0.01, wall_s=0.36, batches_made=10000,
                       records=160000, stages={"read": 0.4, "collate": 0.2, "hand-over": 0.05,
                                               "consumer wait": 0.35, "step": 0.01},
                       workers=ahead, num_workers=2, ready_ahead=45.0)
    d = diagnose(fast, num_workers=2, cores=2)
    assert d.bottleneck == "main" and "the loop waits 0.035 ms a batch" in d.advice[0], d
    # a worker whose transform runs GIL-free threads uses 1.66 cores: "1 of 2 cores idle:
    # num_workers=2, expected ~2.0x" (2 workers ran at 1.07x)
    threads = (WorkerStats(0, 1, 400, 6400, 1 << 20, busy_s=7.23, cpu_s=11.99,
                           stages={"Map(hashy)": 7.1, "read": 0.13}),)
    busy = LoaderStats(batches=400, wait_s=7.0, run_s=0.1, wall_s=7.23, batches_made=400,
                       records=6400, stages={"Map(hashy)": 7.1, "read": 0.13,
                                             "consumer wait": 7.0, "step": 0.1},
                       workers=threads, num_workers=1)
    d = diagnose(busy, num_workers=1, cores=2)
    assert not any("cores idle" in a for a in d.advice), d
    # (a review of the first version:) a 12 ms step and 8 ms of making in process: one worker
    # overlaps them (~1.7x), which a cap of "one worker: 1x" left out; and 8 workers of 1 ms a
    # batch, the loop waiting 60 us: not "num_workers=0" (3.6x slower)
    inline = LoaderStats(batches=200, wait_s=1.6, run_s=2.4, wall_s=4.0, batches_made=200,
                         records=3200, stages={"read": 1.6, "consumer wait": 1.6, "step": 2.4})
    d = diagnose(inline, num_workers=0, cores=2)
    assert "num_workers=1 makes them in parallel, expected ~1.7x" in d.advice[0], d
    eight = tuple(WorkerStats(i, 1, 1250, 20000, 1 << 20, busy_s=1.25, cpu_s=1.25,
                              stages={"Map(decode)": 1.125, "read": 0.125}) for i in range(8))
    many = LoaderStats(batches=10000, wait_s=0.6, run_s=3.0, wall_s=3.6, batches_made=10000,
                       records=160000, stages={"Map(decode)": 9.0, "read": 1.0, "hand-over": 0.3,
                                               "consumer wait": 0.6, "step": 3.0},
                       workers=eight, num_workers=8, ready_ahead=30.0)
    d = diagnose(many, num_workers=8, cores=16)
    assert not any("num_workers=0" in a for a in d.advice), d


def test_the_padding_of_a_padded_batch_is_not_counted_as_records():
    # last_batch="pad": 12 records counted for 10 (records_per_s too); (with workers the
    # count is the timed batches' mean size: an estimate)
    with jl.DataLoader(arrays(10), batch_size=4, last_batch="pad", **ONE) as loader:
        assert len(list(loader)) == 3
        assert loader.stats.records == 10


def test_a_worker_going_idle_sends_its_timings():
    # they rode on a Done every 50 ms at most: 80 batches handed out, 2 made as the stats
    # said (a Done without them is read only when its step is needed)
    with jl.DataLoader(arrays(80), batch_size=4, num_workers=1, **ONE) as loader:
        assert len(list(loader)) == 20
        time.sleep(0.2)
        assert loader.stats.batches_made == 20


def test_a_loop_paused_after_a_few_batches_is_judged_on_the_workers_work_for_them():
    # a worker held its timings until 50 ms had passed or its inbox was empty, and the Done
    # that then carried them was never read by a loop paused: 12 batches handed out, 1 made
    # as the stats said, the worker 10% busy, and the verdict "main" for a busy worker
    def burn(record):  # (0.2 ms a record: 12 batches in under 50 ms)
        spin(0.0002)
        return record

    with jl.DataLoader(arrays(2048), batch_size=8, num_workers=1, num_epochs=None,
                       transforms=[jl.Map(burn)], **ONE) as loader:
        it = iter(loader)
        for _ in range(12):
            next(it)
        stats = loader.stats
        assert stats.batches_made >= 12, stats  # (and their work: 0.2 ms of CPU a record)
        assert stats.workers[0].busy_s >= 12 * 8 * 0.0002, stats


def test_after_reset_stats_the_workers_timings_are_of_work_done_since():
    # a task's timings ride on a Done read later: work made ahead before the reset came in
    # after it (a worker busy 273x the window's wall time, clipped to 100% busy)
    with jl.DataLoader(arrays(4000), batch_size=16, num_workers=1, num_epochs=None,
                       transforms=[jl.Map(heavy)], **ONE) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        time.sleep(0.3)  # the worker makes batches ahead meanwhile
        loader.reset_stats()
        for _ in range(150):  # past those made ahead: a window with the worker's work in it
            next(it)
        stats = loader.stats
    busy = sum(w.busy_s for w in stats.workers)
    assert 0 < busy <= stats.wall_s + 0.05, stats


def test_read_threads_are_advised_for_sources_read_record_by_record_and_counted_as_threads():
    # the remote-storage audit: read_threads=16 advised for a Parquet source, which reads a
    # batch at once (16 threads: the same 26.4 batches/s); 32 read threads' summed queueing
    # (the cores mostly idle) taken for a worker short of cores ("every
    # core is in use"); and in process, no word of read_threads for reads waiting on files
    from jaxloader.base.stats import WorkerStats

    waiting = tuple(WorkerStats(i, 1, 50, 800, 1 << 20, busy_s=2.9, cpu_s=1.0, queued_s=1.7,
                                stages={"read": 2.8, "collate": 0.1}) for i in range(2))
    stats = LoaderStats(batches=100, wait_s=2.5, run_s=0.5, wall_s=3.0, batches_made=100,
                        records=1600, stages={"read": 5.6, "collate": 0.2,
                                              "consumer wait": 2.5, "step": 0.5},
                        workers=waiting, num_workers=2)
    d = diagnose(stats, num_workers=2, cores=2, read_threads=32)
    assert d.bottleneck == "source" and "reads wait" in d.advice[0], d
    # each read waits as long as a task's records read on its 32 threads at once (a task's
    # batches are read together), not 1/16 of it (20 ms a read was said 1.3 ms; the
    # diagnosis audit), nor 1/16 for batches of 16 (2 ms reads were said 0.41 ms for batches
    # of 4 on 16 threads, 2 ms for batches of 32; the profiling audit)
    assert "reads wait ~74 ms a record" in d.advice[0], d.advice[0]  # (58 ms a batch, 63%)
    quarter = tuple(w._replace(busy_s=w.busy_s / 4, cpu_s=w.cpu_s / 4, queued_s=w.queued_s / 4,
                               stages={k: v / 4 for k, v in w.stages.items()}) for w in waiting)
    short = stats._replace(records=400, wait_s=2.5 / 4, run_s=0.5 / 4, wall_s=3.0 / 4,
                           workers=quarter, stages={k: v / 4 for k, v in stats.stages.items()})
    d = diagnose(short, num_workers=2, cores=2, read_threads=32)  # (batches of 4, each read
    assert "reads wait ~74 ms a record" in d.advice[0], d  # waiting as long: ~9 ms was said)
    assert "read_threads=64" in d.advice[1], d
    assert "every core is in use" not in str(d), d
    assert not any("read_threads" in a for a in diagnose(stats, num_workers=2, cores=2,
                                                         read_threads=None).advice)
    source = WaitingSource(512)
    with jl.DataLoader(source, batch_size=8, **ONE) as loader:
        for _, _batch in zip(range(12), loader):
            pass
        advice = loader.diagnose().advice
    # (its reads wait off the CPU: read_threads first, with its gain; the profiling audit
    # measured 4.0x for it against 2.2x for the workers advised first)
    assert "reads wait off the CPU: read_threads=16" in advice[0] and "expected ~" in advice[0]
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    import tempfile

    path = tempfile.mkdtemp() + "/x.parquet"
    pq.write_table(pa.table({"x": np.arange(64)}), path)
    with jl.DataLoader(jl.ParquetSource(path), batch_size=8, **ONE) as loader:
        assert loader._maker.threaded_reads is None
    with jl.DataLoader(source, batch_size=8, read_threads=4, **ONE) as loader:
        assert loader._maker.threaded_reads == 4
    # wrappers read a part's records each on the threads (the second review: none advised)
    for wrapped, threads in ((jl.MapSource(source, light), 4),
                             (jl.ConcatSource([source, source]), 4),
                             (jl.MapSource(jl.ParquetSource(path), light), None),
                             (type("MyMap", (jl.MapSource,), {})(source, light), 4)):
        with jl.DataLoader(wrapped, batch_size=8, read_threads=4, **ONE) as loader:
            assert loader._maker.threaded_reads == threads, wrapped


def test_a_map_sources_function_is_named_where_reading_is_the_bottleneck():
    # (a mixture's components decoding in MapSources: "make reading (the source's own code)
    # cheaper", as if it were storage; the decoder was not named)
    from jaxloader.loaders.diagnosis import mapped_functions

    def decode_clips(r):
        return r

    part = jl.MapSource(arrays(64), decode_clips)
    assert mapped_functions(jl.mix([part, jl.MapSource(arrays(64), decode_clips)],
                                   [0.5, 0.5])) == [
        "MapSource(test_a_map_sources_function_is_named_where_reading_is_the_bottleneck."
        "<locals>.decode_clips)"]
    assert mapped_functions(arrays(8)) == [] and mapped_functions(None) == []
    busy = tuple(WorkerStats(i, 1, 50, 800, 1 << 20, busy_s=2.9, cpu_s=2.8,
                             stages={"read": 2.8, "collate": 0.1}) for i in range(2))
    stats = LoaderStats(batches=100, wait_s=2.5, run_s=0.5, wall_s=3.0, batches_made=100,
                        records=1600, stages={"read": 5.6, "collate": 0.2,
                                              "consumer wait": 2.5, "step": 0.5},
                        workers=busy, num_workers=2)
    d = diagnose(stats, num_workers=2, cores=2, mapped=["MapSource(decode_clips)"])
    assert d.bottleneck == "source" and "reading includes MapSource(decode_clips): its " \
        "function's CPU work" in d.advice[-1], d
    assert not any("MapSource" in a for a in diagnose(stats, num_workers=2, cores=2).advice)


def test_a_compilation_on_a_batch_not_timed_is_booked_as_one(monkeypatch):
    # a partial last batch's new shape compiled on a batch not timed (one in 16 is): its
    # compilation stayed in the JitMap's share of the time worked, ~5x its cost a batch
    from jaxloader.batching.jit_map import JitMap

    compiled = []
    run = JitMap.run

    def counted(self, *args, **kwargs):
        out = run(self, *args, **kwargs)
        compiled.append(out[3])
        return out
    monkeypatch.setattr(JitMap, "run", counted)
    stats, _ = run_all(jl.DataLoader(arrays(1000), batch_size=24, last_batch="partial",
                                     transforms=[jl.JitMap(_tanh)], **ONE))
    assert len(compiled) == 42 and compiled[-1] > 0, compiled  # (1,000 = 41 x 24 + 16)
    assert stats.stages["JitMap(_tanh) compile"] == pytest.approx(sum(compiled))


def run_all(loader):
    with loader:
        for _ in loader:
            pass
        return loader.stats, None


def test_placement_that_costs_its_calls_is_not_told_to_lower_the_precision():
    # 0.2 ms to place 33 KB (a call's cost, not its bytes') was told to cast to bfloat16/uint8
    from jaxloader.loaders.advice import placement_advice

    small = placement_advice(0.2, 1000, True, 33_000)  # (0.2 ms a batch: 165 MB/s)
    assert "the cost of its calls, not its bytes" in small and "bfloat16" not in small, small
    large = placement_advice(2.0, 1000, True, 64e6)  # (2 ms for 64 MB: 32 GB/s)
    assert "a lower precision (a Map to bfloat16/uint8)" in large, large
    slow = placement_advice(150.0, 1000, True, 100e6)  # (150 ms: a slow copy, not a call's)
    assert "a lower precision (a Map to bfloat16/uint8)" in slow, slow
    # 300 leaves of 1 KB to 8 devices, 40 ms a batch: float16 made it no faster, 10 leaves of
    # the same bytes took 1.9 ms (the diagnosis audit: only under 1 ms was it the calls)
    many = placement_advice(40.0, 1000, True, 307_000)
    assert "the cost of its calls, not its bytes" in many and "bfloat16" not in many, many
    assert "a lower precision (a Map" in placement_advice(150.0, 1000, True, 12e6)  # (as 100 MB)


def test_a_step_that_waits_for_an_accelerator_holds_no_core_in_the_verdict():
    # the training step's wall time was counted as a core in use: a step waiting on a GPU
    # (block_until_ready) left "every core is in use (1 workers on 2 cores)" where a second
    # worker gave 1.3x; the process's CPU time says what it used
    busy = WorkerStats(0, 1, 200, 1600, 1 << 20, busy_s=3.4, cpu_s=3.4,
                       stages={"read": 0.1, "Map(heavy)": 3.3})
    stats = LoaderStats(batches=200, wait_s=1.0, run_s=2.4, wall_s=3.5, batches_made=200,
                        stages={"read": 0.1, "Map(heavy)": 3.3, "hand-over": 0.02,
                                "consumer wait": 1.0, "step": 2.4}, workers=(busy,),
                        main_cpu_s=0.06)
    d = diagnose(stats, num_workers=1, cores=2)
    assert d.bottleneck == "workers" and d.advice[0].startswith("1 of 2 cores idle: "
                                                                "num_workers=2"), d.advice
    computing = stats._replace(main_cpu_s=2.4)  # (a step on the host: its core is in use)
    assert "every core is in use" in " ".join(diagnose(computing, num_workers=1, cores=2).advice)


def test_the_training_processs_cpu_time_is_measured_over_the_window():
    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=4, num_workers=1,
                           process_index=0, process_count=1)
    with loader:
        batches = iter(loader)
        next(batches)
        loader.reset_stats()
        for _ in range(8):
            next(batches)
            spin(0.02)  # (the step's host work: the process's CPU)
        stats = loader.stats
    assert 0.1 < stats.main_cpu_s <= stats.wall_s * 1.05 + 0.01, stats
    assert stats.since(stats).main_cpu_s == 0.0


def test_a_workers_time_queued_for_a_core_counts_from_the_windows_first_batch(monkeypatch):
    # counted from the worker's birth (the constructor's stats had no pids yet): the start of
    # 8 interpreters on 2 cores made sleeping reads "queued", and the verdict "every core is
    # in use: make reading cheaper", where more workers helped (the diagnosis audit)
    from jaxloader.loaders import iterator

    queued = [5.0]  # (a worker's schedstat: 5 s queued as it started)
    monkeypatch.setattr(iterator, "queued_s", lambda pid: queued[0])
    loader = jl.DataLoader(WaitingSource(4096, 0.001), batch_size=8, num_workers=1,
                           process_index=0, process_count=1)
    with loader:
        batches = iter(loader)
        next(batches)
        queued[0] = 5.01
        for _ in range(20):
            next(batches)
        worker = loader.stats.workers[0]
        assert worker.busy_s - worker.cpu_s > 0.1 and worker.queued_s == pytest.approx(0.01)
        # a Ctrl-C in next(): the workers start anew, each counted from its first batch (the
        # review: counted from birth again)
        before, batches._next = loader.worker_pids, _interrupted
        with pytest.raises(KeyboardInterrupt):
            next(batches)
        loader._engine._restart()  # (as after a Ctrl-C that cut a message)
        queued[0] = 9.0  # (the new worker's start: 9 s, none of it the window's)
        next(batches)
        queued[0] = 9.02
        for _ in range(20):
            next(batches)
        assert loader.worker_pids != before
        assert loader.stats.workers[0].queued_s == pytest.approx(0.02)


def _interrupted():
    raise KeyboardInterrupt


def test_a_slot_wait_inside_a_timed_collation_is_not_counted_twice():
    # a slot wait is timed each time and was also inside the timed batch's collation span:
    # read 1 s, collation 1 s and a 2 s wait inside it were split read 0.5, collate 1.5 (the
    # stages still added up to the time worked), blaming collation for the wait (the audit)
    from time import perf_counter

    from jaxloader.base.timings import COLLATE, READ, SLOT_WAIT, StageClock

    clock = StageClock()
    clock.made += 1
    now = perf_counter()
    start = clock.span(READ, now - 1.0)  # a read of 1 s
    clock.add(SLOT_WAIT, 2.0)  # a wait for a bigger slot, inside the collation (ends now)
    clock.span(COLLATE, start - 3.0)  # the collation's span: 1 s of its own and the wait
    clock.count(8, 100)
    stages = dict(clock.take(busy=4.0)[0])
    assert stages[SLOT_WAIT] == 2.0
    assert 0.95 < stages[READ] / stages[COLLATE] < 1.05, stages  # (was 1:3 before)
    assert abs(sum(stages.values()) - 4.0) < 1e-9


def test_a_jitmaps_compilation_leaves_the_workers_busy_share_of_the_steady_run():
    # busy was capped at 100% before the compilation (in the first batch, outside the
    # steady time) was taken off: 2.7 s busy of a 3 s steady run read as 57% busy, "they
    # wait for tasks (prefetch)", where 3 of 4 cores were idle (the audit)
    stages = {"read": 0.2, "JitMap(f)": 2.4, "collate": 0.1, "JitMap(f) compile": 2.0}
    worker = WorkerStats(0, 1, 100, 3200, 1 << 20, busy_s=4.7, cpu_s=4.6, stages=stages)
    stats = LoaderStats(batches=100, wait_s=4.6, run_s=0.4, wall_s=5.0, records=3200,
                        bytes=1 << 20, stages={**stages, "consumer wait": 4.6, "step": 0.4},
                        workers=(worker,), num_workers=1, batches_made=100, first_batch_s=2.0)
    d = diagnose(stats, num_workers=1, cores=4)
    assert d.bottleneck == "workers", d
    assert any("cores idle: num_workers=" in a for a in d.advice), d
    assert not any("busy only" in a for a in d.advice), d


def test_workers_waiting_for_a_slot_wait_on_the_training_process_not_on_their_work():
    # a slot wait (a bigger slot asked of the training process, busy placing batches) was
    # counted as the workers' busy time and off-CPU wait: "workers", "the transforms wait
    # (files, the network, sleeps, locks)... num_workers=4", where there are no transforms
    # and 2 workers ran at half the speed of none (the audit: 60 small leaves, sharding=)
    workers = tuple(WorkerStats(i, 1, 100, 800, 1 << 20, busy_s=0.9, cpu_s=0.3, stages={
        "read": 0.1, "collate": 0.2, "slot wait": 0.6}) for i in range(2))
    stats = LoaderStats(batches=200, wait_s=0.7, run_s=0.05, wall_s=1.1, records=1600,
                        bytes=200 << 20, stages={"read": 0.2, "collate": 0.4, "slot wait": 1.2,
                                                 "placement": 0.5, "hand-over": 0.05,
                                                 "consumer wait": 0.7, "step": 0.05},
                        workers=workers, num_workers=2, batches_made=200, first_batch_s=0.1)
    d = diagnose(stats, num_workers=2, cores=4)
    assert d.bottleneck == "device", d
    assert not any("transforms wait" in a for a in d.advice), d


def test_batches_ready_ahead_while_the_loop_waits_are_the_training_processs_hand_over():
    # 2 workers 16% busy, 27 batches ready behind each one handed out, the hand-over's timers
    # seeing a tenth of the wait: "workers" (or "source"), "a larger prefetch= helps", where
    # num_workers=0 ran 3x faster (the audit: batches of 8 floats)
    workers = tuple(WorkerStats(i, 1, 1000, 8000, 1 << 16, busy_s=0.04, cpu_s=0.04, stages={
        "read": 0.02, "collate": 0.02}) for i in range(2))
    stats = LoaderStats(batches=2000, wait_s=0.16, run_s=0.1, wall_s=0.27, records=16000,
                        bytes=1 << 17, stages={"read": 0.04, "collate": 0.04, "hand-over": 0.015,
                                               "consumer wait": 0.16, "step": 0.1},
                        workers=workers, num_workers=2, ready_ahead=27.0, batches_made=2000,
                        first_batch_s=0.01)
    d = diagnose(stats, num_workers=2, cores=2)
    assert d.bottleneck == "main", d
    assert "27 batches ready behind each one" in d.advice[0], d
    assert "num_workers=0, or larger batches" in d.advice[1], d
    assert not any("prefetch=" in a for a in d.advice), d


def test_a_stream_whose_readers_divide_among_no_more_workers_is_advised_more_readers():
    # readers_per_process left to follow num_workers: a count the readers divide was all the
    # advice took, so "workers would not make them much sooner" (in process) and "every core
    # is in use" (2 workers, reads sleeping), where 2 workers ran 1.9x faster (the audit)
    inline = LoaderStats(batches=40, wait_s=0.36, run_s=0.004, wall_s=0.37, batches_made=40,
                         records=320, stages={"read": 0.35, "collate": 0.01,
                                              "consumer wait": 0.36, "step": 0.004})
    d = diagnose(inline, num_workers=0, cores=2, counts=[1])
    assert "readers_per_process=2 and num_workers=2" in d.advice[0], d
    workers = tuple(WorkerStats(i, 1, 20, 160, 1 << 12, busy_s=0.18, cpu_s=0.02, stages={
        "read": 0.17, "collate": 0.01}) for i in range(2))
    waiting = LoaderStats(batches=40, wait_s=0.17, run_s=0.004, wall_s=0.19, batches_made=40,
                          records=320, stages={"read": 0.34, "collate": 0.02,
                                               "consumer wait": 0.17, "step": 0.004},
                          workers=workers, num_workers=2, first_batch_s=0.01)
    d = diagnose(waiting, num_workers=2, cores=2, counts=[1, 2])
    assert d.bottleneck == "source", d
    assert "reads wait" in d.advice[0] and "readers_per_process=4 and num_workers=4" in \
        d.advice[0], d


def test_one_late_worker_with_the_others_batches_ready_is_the_workers_not_the_main_process():
    # (the review of the rule above:) one of 4 workers stalls on its reads, the others'
    # batches wait ready behind the one the loop needs: ready_ahead 5, but the wait is that
    # worker's, not the training process's
    workers = (WorkerStats(0, 1, 100, 800, 1 << 16, busy_s=0.95, cpu_s=0.1, stages={
        "read": 0.9, "collate": 0.05}),) + tuple(WorkerStats(i, 1, 100, 800, 1 << 16,
                                                             busy_s=0.1, cpu_s=0.1, stages={
            "read": 0.05, "collate": 0.05}) for i in range(1, 4))
    stats = LoaderStats(batches=400, wait_s=0.6, run_s=0.3, wall_s=1.0, records=3200,
                        bytes=1 << 18, stages={"read": 1.05, "collate": 0.2, "hand-over": 0.02,
                                               "consumer wait": 0.6, "step": 0.3},
                        workers=workers, num_workers=4, ready_ahead=5.0, batches_made=400,
                        first_batch_s=0.01)
    d = diagnose(stats, num_workers=4, cores=8)
    assert d.bottleneck == "source", d


def test_the_expected_gain_takes_the_step_over_the_steps_timed_not_the_batches():
    # two batches, a 1 s step between them, each made in 0.1 s then 1 s in the training
    # process: workers can at best overlap the making with the step, 2x; the step was taken
    # as run_s over the batches (0.5 s, one step timed for two batches), and 4x advised
    whole = LoaderStats(batches=2, wait_s=1.1, run_s=1.0, wall_s=2.1, first_batch_s=0.1,
                        batches_made=2, stages={"read": 1.1})
    said = "\n".join(diagnose(whole, num_workers=0, cores=4).advice)
    assert "num_workers=4 makes them in parallel, expected ~2.0x" in said, said
    # a window after the first batch times a step before each of its batches
    window = LoaderStats(batches=11, wait_s=4.0, run_s=2.0, wall_s=6.0, first_batch_s=2.0,
                         batches_made=11, stages={"read": 4.0}).since(
        LoaderStats(batches=1, wait_s=2.0, run_s=0.0, wall_s=2.0, first_batch_s=2.0,
                    batches_made=1, stages={"read": 2.0}))
    said = "\n".join(diagnose(window, num_workers=0, cores=4).advice)
    assert "num_workers=4 makes them in parallel, expected ~2.0x" in said, said


def test_a_pass_starts_long_waits_are_said_not_blamed_on_the_training_process():
    # (the API audit) one worker 2.5x faster than the step: a 230 ms wait as the pass began
    # (its first tasks made), then none; batches were ready on average, and diagnose() said
    # "main": "6 batches ready behind each one handed out: the loop waits ... on the
    # training process itself"
    idle = WorkerStats(0, 1, 30, 240, 1 << 16, busy_s=0.5, cpu_s=0.05, stages={"read": 0.5})
    stats = LoaderStats(batches=30, wait_s=0.27, run_s=1.2, wall_s=1.47, batches_made=30,
                        stages={"read": 0.5, "hand-over": 0.003, "consumer wait": 0.27,
                                "step": 1.2}, workers=(idle,), ready_ahead=6.0,
                        first_batch_s=0.03, stalls=1, stalled_s=0.23)
    d = diagnose(stats, num_workers=1, cores=4)
    assert d.bottleneck == "step", d
    assert "96% of it in 1 long wait(s) (230 ms each) as passes started" in d.advice[0], d.advice
    assert diagnose(stats._replace(stalls=0, stalled_s=0.0), 1, 4).bottleneck == "main"  # before
    spread = stats._replace(stalls=20, stalled_s=0.23)  # (a wait at most steps: not a stall)
    assert diagnose(spread, num_workers=1, cores=4).bottleneck != "step"
    short = stats._replace(wait_s=2.03, stalled_s=2.0)  # (most of the time: short passes'
    d = diagnose(short, num_workers=1, cores=4)  # starts are the input's limit: the review)
    assert d.bottleneck != "step" and "long wait(s) as passes started" in d.advice[-1], d
    # (the Ray audit) with no workers, or an endless loader, no pass starts nor first tasks,
    # and num_epochs=None is no remedy: the run's start, a slow first read, said as such
    for workers, endless, said in ((0, False, "early in a pass (a slow first read"),
                                   (1, True, "as the run started and the workers made")):
        d = diagnose(short, num_workers=workers, cores=4, endless=endless)
        assert said in d.advice[-1] and "num_epochs" not in d.advice[-1], d
    d = diagnose(stats, num_workers=1, cores=4, endless=True)
    assert "as the run started" in d.advice[0] and "num_epochs" not in d.advice[0], d


def test_a_busy_workers_waits_that_come_a_task_at_a_time_are_not_taken_for_a_start():
    # one worker busy the run through, its task's batches coming at once: the waits at each
    # task's first batch, in the first 32 steps, were taken for a pass's start and taken off
    # the time a batch: "num_workers=4, expected ~1.5x" (2.7x measured for 4 workers on 2
    # cores), "62% of the wait in 3 long wait(s) as passes started" (the profiling audit)
    worker = WorkerStats(0, 1, 40, 320, 1 << 16, busy_s=0.98, cpu_s=0.97,
                         stages={"Map(f)": 0.9, "read": 0.05, "collate": 0.03})
    stats = LoaderStats(batches=40, wait_s=1.0, run_s=0.002, wall_s=1.0, batches_made=40,
                        stages={"Map(f)": 0.9, "read": 0.05, "collate": 0.03,
                                "hand-over": 0.003}, workers=(worker,), ready_ahead=0.5,
                        first_batch_s=0.04, stalls=3, stalled_s=0.6)
    d = diagnose(stats, num_workers=1, cores=4)
    assert d.bottleneck == "workers" and "num_workers=4, expected ~4.0x" in d.advice[0], d
    assert not any("long wait" in a for a in d.advice), d


def test_stats_since_something_other_than_stats_is_refused_naming_what_it_takes():
    stats = LoaderStats(batches=10, wait_s=1.0, run_s=1.0, wall_s=2.0)
    for other in (5, {}, {"step": 10}):  # (a state_dict(): AttributeError 'began')
        with pytest.raises(jl.ConfigError, match=r"LoaderStats.since\(earlier\): expected the "
                                                 r"LoaderStats read earlier from loader.stats"):
            stats.since(other)


def test_the_table_and_the_advice_give_a_stage_the_same_share():
    # the table counted a worker's slot wait in its total, the advice not: "BatchMap(bm) 97%"
    # in the table, "takes 98%" in the advice (the diagnosis audit)
    from jaxloader.base.stats import WorkerStats

    worker = WorkerStats(0, 1, 100, 1600, 1 << 20, busy_s=3.0, cpu_s=3.0,
                         stages={"Map(f)": 2.45, "collate": 0.05, "slot wait": 0.5})
    stats = LoaderStats(batches=100, wait_s=2.5, run_s=0.5, wall_s=3.0, batches_made=100,
                        records=1600, stages={**worker.stages, "consumer wait": 2.5,
                                              "step": 0.5}, workers=(worker,), num_workers=1)
    d = diagnose(stats, num_workers=1, cores=1)
    assert any("Map(f) takes 98%" in a for a in d.advice), d.advice
    rows = {line.split()[0]: line.split()[-1] for line in str(d).splitlines()[2:5]}
    assert rows == {"Map(f)": "98%", "slot": "(wait)", "collate": "2%"}, str(d)


def test_batches_made_here_in_more_time_than_the_loop_waits_are_not_told_workers_would_not_help():
    # 128 MiB batches placed on 8 devices, in process: collated into new memory each batch
    # (250 ms; 66 in a worker's reused slot) beside the loop, which waited 184 ms: "workers
    # would not make them much sooner", where one worker was 2.8x faster (the diagnosis audit)
    big = LoaderStats(batches=21, wait_s=3.68, run_s=0.2, wall_s=3.9, batches_made=22,
                      records=21 * 64, first_batch_s=0.02, stages={
                          "read": 0.3, "collate": 5.5, "placement": 3.2, "consumer wait": 3.68,
                          "step": 0.2})
    d = diagnose(big, num_workers=0, cores=2, placed_in_thread=False)
    assert d.bottleneck == "main" and "would not" not in d.advice[0], d
    assert "num_workers=1 makes them in a worker process" in d.advice[0], d
    # ... but made in the loop's own time (5 ms a batch, all of it in next(), one core): one
    # worker would make them no sooner, as factor() says (the review)
    inline = LoaderStats(batches=100, wait_s=0.5, run_s=0.005, wall_s=0.505, batches_made=100,
                         records=800, stages={"read": 0.4, "collate": 0.1,
                                              "consumer wait": 0.5, "step": 0.005})
    d = diagnose(inline, num_workers=0, cores=1)
    assert "workers would not make them much sooner" in d.advice[0], d
