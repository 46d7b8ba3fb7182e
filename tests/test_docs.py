"""The documentation: every link between README.md and docs/ resolves (files and anchors), the
README stays a front page, and its two commands are the ones CI runs."""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(
    os.path.join(ROOT, "docs")) if f.endswith(".md"))
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"```.*?```", re.S)


def _anchors(path: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to -."""
    text = _CODE.sub("", open(os.path.join(ROOT, path), encoding="utf-8").read())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES)
def test_every_link_resolves(page):
    text = _CODE.sub("", open(os.path.join(ROOT, page), encoding="utf-8").read())
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue  # (the web is not reached from the tests)
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(os.path.join(ROOT, resolved)):
            broken.append(f"{target}: no file {resolved}")
        elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved}")
    assert not broken, f"{page}: " + "; ".join(broken)


def test_the_readme_is_a_front_page_with_the_two_commands():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert readme.count("\n") <= 200
    assert 'pip install -e ".[examples]" && python examples/train_digits.py' in readme
    assert 'pip install -e ".[test]" && python -m pytest' in readme
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert 'pip install -e ".[test]" && python -m pytest' in ci  # CI runs README's command
