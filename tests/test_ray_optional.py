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
