"""Shared fixtures: every test must leave no jaxloader segment in /dev/shm and no live child."""

from __future__ import annotations

import multiprocessing
import os

import pytest


def _segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if "jaxloader" in n}
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def no_leaks():
    before = _segments()
    yield
    children = [p for p in multiprocessing.active_children() if p.is_alive()]
    assert not children, f"live child processes left behind: {children}"
    leaked = _segments() - before
    assert not leaked, f"shared-memory segments left in /dev/shm: {sorted(leaked)}"
