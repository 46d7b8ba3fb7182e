"""Ray is optional: without it, RayWorkers says how to install it (runs with or without Ray)."""

import importlib.util

import pytest

from jaxloader.ray import RayWorkers


def test_ray_workers_without_ray_give_the_install_command(monkeypatch):
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else found(name, *a))
    with pytest.raises(ImportError, match=r'RayWorkers needs Ray, which is not installed: '
                                          r'pip install "jaxloader\[ray\]"'):
        RayWorkers(2)


def test_ray_actors_run_with_the_training_processs_optimize_flag(monkeypatch):
    # a transform's assert failed in a Ray actor under python -O, where local workers (started
    # with the flag) and num_workers=0 skipped it (the interpreter flags audit)
    import sys
    import types

    from jaxloader.ray_actor import with_worker_environment

    flags = types.SimpleNamespace(**{name: getattr(sys.flags, name) for name in dir(sys.flags)
                                     if not name.startswith("_") and not callable(
                                         getattr(sys.flags, name))})
    flags.optimize = 1
    monkeypatch.setattr(sys, "flags", flags)
    env = with_worker_environment({})["runtime_env"]["env_vars"]
    assert env["PYTHONOPTIMIZE"] == "1"
    given = with_worker_environment({"runtime_env": {"env_vars": {"PYTHONOPTIMIZE": "0"}}})
    assert given["runtime_env"]["env_vars"]["PYTHONOPTIMIZE"] == "0"  # (the user's own kept)
    flags.optimize = 0
    assert "PYTHONOPTIMIZE" not in with_worker_environment({})["runtime_env"]["env_vars"]
