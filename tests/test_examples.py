"""The examples run: kill-and-resume is exact, the notebook and the multi-host launcher work."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.timeout(420), pytest.mark.e2e]
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
# script, its arguments, total steps, save every, kill after (at least); as short as the
# checks allow (each run's start is most of its time, but not of the LM's: its steps and its
# held-out pass, over a tenth of --files modules, are)
RUNS = {
    "digits": ("train_digits.py", (), 180, 25, 75),
    "digits, Flax NNX": ("train_digits_nnx.py", (), 180, 25, 75),
    "packed LM": ("train_lm.py", ("--length", "128", "--batch-size", "8", "--files", "100"),
                  80, 20, 40),
}


def _train(workdir, script, args, steps, save_every, *extra) -> subprocess.Popen:
    with _ctrl_c_reaches_children():
        return subprocess.Popen(
        [sys.executable, os.path.join(EXAMPLES, script), *args, "--steps", str(steps),
         "--save-every", str(save_every), "--loss-log", "losses.jsonl", *extra],
            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu",
                 **_compilation_cache(workdir.parent / "compiled")})


@contextlib.contextmanager
def _ctrl_c_reaches_children():
    """A run started here takes a SIGINT as a Ctrl-C even where the tests ignore SIGINT: a
    job a script starts in the background (CI's) has SIGINT ignored, an ignored signal stays
    ignored across exec, and Python then installs no KeyboardInterrupt handler (the run
    trained to its end). A handler of ours is reset to the default by exec instead."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _compilation_cache(directory) -> dict[str, str]:
    """JAX's persistent compilation cache in ``directory``, every executable kept: a test's
    runs after its first load the train step where they compiled it (~4 s a run of the LM);
    the losses compared across runs then also say the cached executable computes what the
    compiled one did."""
    return {"JAX_COMPILATION_CACHE_DIR": str(directory),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}


def _losses(path) -> list[dict]:
    """The log's complete lines: a line the training process is still writing (no newline
    yet) is left out (it was read half-written once, and json.loads failed)."""
    with open(path) as f:
        return [json.loads(line) for line in f.read().split("\n")[:-1] if line.strip()]


@pytest.mark.parametrize("run", list(RUNS))
def test_killed_training_resumes_with_the_same_losses(tmp_path, run):
    script, args, steps, save_every, kill_after = RUNS[run]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    proc = _train(whole, script, args, steps, save_every)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    reference = {r["step"]: r["loss"] for r in _losses(whole / "losses.jsonl")}
    assert sorted(reference) == list(range(1, steps + 1))
    digits = run.startswith("digits")
    assert ("test accuracy" if digits else "final loss") in out
    if run == "digits, Flax NNX":  # its own run's folder, not the Linen one's (it took it)
        assert sorted(os.listdir(whole / "checkpoints")) == ["digits_nnx", "digits_nnx.lock"]
    if not digits:  # it learns: the loss at the end is well below the start
        assert reference[steps] < 0.75 * reference[1], (reference[1], reference[steps])
        files = int(args[args.index("--files") + 1])
        held_out = _held_out_line(out, files)

    proc = _train(cut, script, args, steps, save_every)  # stopped (Ctrl-C, SIGKILL) after step k
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        done = _losses(cut / "losses.jsonl") if (cut / "losses.jsonl").exists() else []
        if done and done[-1]["step"] >= kill_after:
            break
        assert proc.poll() is None, proc.communicate()[1][-3000:]  # (ended: said, not waited)
        time.sleep(0.01)
    stop = signal.SIGINT if run == "digits" else signal.SIGKILL  # (README's main job: a
    proc.send_signal(stop)  # Ctrl-C, as its docs say to stop it; others killed outright)
    _, err = proc.communicate(timeout=120)
    if stop == signal.SIGINT:  # (said in a line, not a KeyboardInterrupt's traceback)
        assert proc.returncode == 130 and "stopped (Ctrl-C); run it again the same way to " \
            "continue from the latest checkpoint" in err, err[-3000:]
    assert "cannot schedule new futures" not in err, err[-3000:]  # (a Ctrl-C as Orbax
    # committed a checkpoint in its thread lost it, an error printed: 3 of 5 Ctrl-Cs)
    killed_at = _losses(cut / "losses.jsonl")[-1]["step"]
    assert kill_after <= killed_at < steps, "the kill must land mid-run"

    proc = _train(cut, script, args, steps, save_every)  # the same command continues the run
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "continuing the run there from step " in out
    resumed_from = int(out.split("resumed from step ")[1].split()[0])
    assert 0 < resumed_from <= killed_at and resumed_from % save_every == 0
    logged = _losses(cut / "losses.jsonl")  # (each step once: the lines of the steps trained
    assert [r["step"] for r in logged] == list(range(1, steps + 1))  # again were dropped)
    resumed = logged[resumed_from:]
    mismatched = [r["step"] for r in resumed if r["loss"] != reference[r["step"]]]
    assert not mismatched, f"losses differ after the restore at steps {mismatched[:10]}"
    if not digits:  # the same model evaluated on the same held-out pass
        assert _held_out_line(out, files) == held_out
    if run == "digits":  # README's main command run once more: the run is done, exit 0
        proc = _train(cut, script, args, steps, save_every)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert f"trained to step {steps} in {cut / 'checkpoints' / 'digits'}; --fresh" in out
        assert _losses(cut / "losses.jsonl")[-1]["step"] == steps  # and nothing trained again


def _held_out_line(out: str, files: int) -> str:
    """The LM example's evaluation line (``--files files``); it must count every held-out byte
    that has a byte before it in its row: a module of n bytes is split into ceil(n / 128) rows'
    pieces."""
    sys.path.insert(0, EXAMPLES)
    try:
        from train_lm import stdlib_paths
    finally:
        sys.path.remove(EXAMPLES)
    sizes = [os.path.getsize(p) for p in stdlib_paths(files, 10)[1]]
    line = next(line for line in out.splitlines() if line.startswith("held-out loss"))
    expected = sum(n - -(-n // 128) for n in sizes)
    assert f"over {expected:,} predicted bytes of {len(sizes)} modules" in line, line
    return line


def test_notebook_runs_top_to_bottom():
    nbformat = pytest.importorskip("nbformat")  # in the test extra; the import documents the need
    from nbclient import NotebookClient

    nb = nbformat.read(os.path.join(EXAMPLES, "colab_quickstart.ipynb"), as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": EXAMPLES}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert re.search(r"jax \d+\.\d+\S* on \w+ with \d+ device", text)  # the first cell's report
    assert "same batches after restore: True" in text
    assert "loader restored at global step 300" in text  # (its first batch was taken to show
    # its type: 301, the model trained from batch 1; the journeys audit)
    assert "test accuracy" in text


def test_multihost_example_trains_on_two_processes():
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, "multihost.py"),
                           "--num-processes", "2", "--steps", "100"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("process ")]
    assert len(lines) == 2 and all("same params on every host: True" in line for line in lines)
    assert all("global batch 64" in line for line in lines)


def test_the_digits_read_from_scikit_learns_file_are_those_load_digits_gives():
    # (read without importing scikit-learn, whose import was most of each run's start)
    import numpy as np
    from sklearn.datasets import load_digits

    sys.path.insert(0, EXAMPLES)
    try:
        from train_digits import load_digits as read
    finally:
        sys.path.remove(EXAMPLES)
    images, labels = read()
    data = load_digits()
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
    np.testing.assert_array_equal(images, data.images)
    np.testing.assert_array_equal(labels, data.target)


class _Opened(Exception):
    pass


@pytest.mark.parametrize("argv, expected", [
    ((), os.path.join("checkpoints", "digits_nnx")),
    (("--checkpoint-dir", os.path.join("checkpoints", "digits")),
     os.path.join("checkpoints", "digits")),  # asked for: taken as given (it was redirected)
])
def test_nnx_example_checkpoint_folder(monkeypatch, argv, expected):
    """The NNX job's runs go to their own folder by default, and to ``--checkpoint-dir`` when
    it is given, the Linen job's default among others."""
    monkeypatch.syspath_prepend(EXAMPLES)
    import train_digits_nnx

    opened = []

    def open_checkpoints(args):
        opened.append(args.checkpoint_dir)
        raise _Opened

    monkeypatch.setattr(train_digits_nnx, "open_checkpoints", open_checkpoints)
    monkeypatch.setattr(sys, "argv", ["train_digits_nnx.py", *argv])
    with pytest.raises(_Opened):
        train_digits_nnx.main()
    assert opened == [expected]


def test_a_checkpoint_folder_in_use_or_a_bad_flag_is_refused(monkeypatch, tmp_path):
    """A second run in one folder failed inside Orbax (a temporary step folder gone) and then
    hung on Orbax's threads, as did a read-only folder; --save-every 0 was a ZeroDivisionError
    in Orbax (the examples audit)."""
    monkeypatch.syspath_prepend(EXAMPLES)
    import train_digits

    args = train_digits.parse_args(["--checkpoint-dir", str(tmp_path / "run"), "--steps", "5"])
    train_digits.open_checkpoints(args).close()
    (tmp_path / "run" / "kept").touch()
    for again in ([], ["--fresh"]):  # (--fresh deleted the folder, the run's lock with it)
        with pytest.raises(SystemExit, match=r"another run is training in .*run \(it holds "
                                             r".*run.lock\)"):
            train_digits.open_checkpoints(train_digits.parse_args([*again, "--checkpoint-dir",
                                                                   str(tmp_path / "run")]))
    assert (tmp_path / "run" / "kept").exists()
    # a resumed run's log drops the steps past its checkpoint, keeps lines of no step; one
    # starting at step 0 (--fresh, or a run stopped before its first checkpoint) drops every
    # step (it appended, and its steps were there twice)
    log = tmp_path / "losses.jsonl"
    log.write_text('{"step": 1}\n\n{"step": 2}\nnot json\n{"step": 3}\n')
    train_digits.loss_log(train_digits.parse_args(["--loss-log", str(log)]), 2).close()
    assert log.read_text() == '{"step": 1}\n\n{"step": 2}\nnot json\n'
    train_digits.loss_log(train_digits.parse_args(["--loss-log", str(log)]), 0).close()
    assert log.read_text() == '\nnot json\n'
    for flag in ("--save-every", "--steps", "--batch-size"):
        with pytest.raises(SystemExit):
            train_digits.parse_args([flag, "0"])
    with pytest.raises(SystemExit):
        train_digits.parse_args(["--workers", "-1"])
    # a bucket's path made a local folder "gs:" and failed after the first 100 steps
    with pytest.raises(SystemExit, match=r"--checkpoint-dir gs://bucket/run: this example keeps "
                                         r"its checkpoints in a local folder"):
        train_digits.open_checkpoints(train_digits.parse_args(["--checkpoint-dir",
                                                               "gs://bucket/run"]))


def test_fresh_says_to_continue_without_it(monkeypatch, tmp_path, capsys):
    # "run the same command again to continue": with --fresh, that deleted the checkpoints
    monkeypatch.syspath_prepend(EXAMPLES)
    import train_digits

    for flags, said in (([], "run it again the same way to continue after a stop"),
                        (["--fresh"], "run it again without --fresh to continue after a stop")):
        train_digits.open_checkpoints(train_digits.parse_args(  # (a folder each: this
            [*flags, "--checkpoint-dir", str(tmp_path / f"run{len(flags)}")])).close()  # process
        # holds each one's lock for its life)
        assert said in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["train_digits.py", "--fresh"])  # (a Ctrl-C said "run the
    with pytest.raises(SystemExit):  # same command again", which deleted them: the review)
        train_digits.stop_said(lambda: signal.default_int_handler(signal.SIGINT, None))
    assert "stopped (Ctrl-C); run it again without --fresh to continue" in capsys.readouterr().err
