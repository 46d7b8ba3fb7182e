"""Two hosts on this machine (jax.distributed, CPU backend) whose loaders differ, and alike."""

from __future__ import annotations

import os

import pytest

from launch import run_hosts

pytestmark = [pytest.mark.timeout(240), pytest.mark.e2e]
HERE = os.path.dirname(os.path.abspath(__file__))


def test_hosts_whose_loaders_differ_are_refused_naming_the_setting_and_alike_ones_run():
    # a host with another seed read its rows of another order: records repeated across the
    # hosts and others never read, without a word; another batch size or step as silently
    pythonpath = os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])
    outs = run_hosts(os.path.join(HERE, "hosts_run.py"), 2, ["{port}"],
                     env={"PYTHONPATH": pythonpath})
    lines = [dict(line.split(" ", 1) for line in out.splitlines()
                  if line.split(" ")[0] in CASES) for out in outs]
    for host in lines:
        for case in ("alike", "late", "stream", "profiled", "profiled_pass", "mask_key_unused"):
            assert host[case].startswith("ok "), (case, host[case])
        for case in ("seed", "batch_size", "step", "mask_key", "stream_seed", "stream_epochs",
                     "files",
                     "stream_shuffle", "index", "stream_index", "stream_epochs_restored"):
            assert host[case].startswith("refused: "), (case, host[case])
    # each host names the other's value first (host 0 sees host 1's 4; host 1 its own 4)
    assert "seed: process 1 has 4, this process (0) 3" in lines[0]["seed"]
    assert "seed: process 0 has 3, this process (1) 4" in lines[1]["seed"]
    assert "batch_size: process 1 has 8, this process (0) 4" in lines[0]["batch_size"]
    assert "global_batch_size: process 1 has 16, this process (0) 8" in lines[0]["batch_size"]
    assert "step: process 0 has 0, this process (1) 2" in lines[1]["step"]
    # (the batches' trees differed: both hung in the first step's collective; the audit)
    assert "mask_key: process 1 has 'valid', this process (0) 'mask'" in lines[0]["mask_key"]
    assert "seed: process 1 has 5, this process (0) 0" in lines[0]["stream_seed"]
    assert "same source, seed, batch_size" in lines[0]["seed"]
    for host in lines:  # (both given process_index=0: read the same rows, without a word)
        for case in ("index", "stream_index"):
            assert "processes 0 and 1 of 2 both read as process_index=0" in host[case]
    # (a stream's pass ends by a collective: compared before it, not left waiting there)
    assert "num_epochs: process 1 has None, this process (0) 1" in lines[0]["stream_epochs"]
    # (restored in mid-pass, host 0 asks the others whether it ended: compared first, not
    # left waiting in that collective while host 1 went on)
    assert "num_epochs: process 1 has None, this process (0) 1" in \
        lines[0]["stream_epochs_restored"]
    assert "same stream, seed, batch_size, readers_per_process" in lines[0]["stream_epochs"]
    assert "stream.shuffle_shards: process 1 has False, this process (0) True" in \
        lines[0]["stream_shuffle"]
    assert lines[0]["alike"] != lines[1]["alike"]  # (each its own rows)
    for out in outs:  # a warning for the other data only
        assert {line.split(" ")[0] for line in out.splitlines() if "_warned " in line} == \
            {"data_warned"}, out
    for host in lines:  # other data of the same length, told apart only by digests: warned
        assert host["data"].startswith("ok "), host["data"]
        assert "the processes' data differ (record_hash: process" in host["data_warned"]
        assert "each of the 2 processes reads its own share" in host["data_warned"]
        assert "the files differ" in host["files"] and "process_count=1" in host["files"]
    assert lines[0]["missing"].startswith("ok ")  # host 0 alone: told, not stopped
    logged = [line for line in outs[0].splitlines() if line.startswith("logged:")]
    assert len(logged) == 1 and "process(es) 1 of 2 have not made this iter() (this " \
        "loader's 1st iter()) within 0.5 s" in logged[0], logged


CASES = {"alike", "seed", "batch_size", "step", "mask_key", "mask_key_unused", "late", "data",
         "data_warned", "files", "index", "stream_index", "stream_epochs_restored", "stream",
         "stream_seed", "stream_epochs", "stream_shuffle", "profiled", "profiled_pass", "missing"}


def test_a_host_alike_with_process_0_is_told_when_process_0_refused_a_third():
    # (host 1 agreed with process 0 while host 2 did not: it went on into the first
    # collective, to wait there until JAX's own timeout, its error naming no host; the
    # multi-host audit)
    pythonpath = os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])
    outs = run_hosts(os.path.join(HERE, "three_hosts_run.py"), 3, ["{port}"],
                     env={"PYTHONPATH": pythonpath})
    said = [out.splitlines()[0] for out in outs]
    assert all(line.startswith("refused: ") for line in said), said
    assert "seed: process 2 has 1, this process (0) 0" in said[0]
    assert "process 0 refused this iter()'s settings, which this process's (1) agree with" in \
        said[1] and "seed: process 2 has 1, this process (0) 0" in said[1]
