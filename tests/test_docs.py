"""The documentation: the site builds with no warning (a broken reference or link fails), the
API reference lists every public name, every page's Python blocks run and print what the page
shows (tests/doc_blocks.py), every link between README.md and docs/ resolves (files and
anchors), the README stays a front page, and its two commands are the ones CI runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaxloader
from doc_blocks import blocks, run_page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted(str(p.relative_to(ROOT)) for p in Path(ROOT, "docs").rglob("*.md")
              if "_build" not in p.parts)
PAGES = ["README.md"] + DOCS
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


def test_every_page_the_package_names_exists():
    # errors and docstrings point users at docs/...; two named pages that had moved
    named = set()
    for path in Path(ROOT, "jaxloader").rglob("*.py"):
        named |= {(m, path.name) for m in re.findall(r"docs/[\w/.-]+\.md",
                                                     path.read_text(encoding="utf-8"))}
    assert named and not sorted((page, where) for page, where in named
                                if not os.path.exists(os.path.join(ROOT, page)))


def test_the_readme_is_a_front_page_with_the_two_commands():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert readme.count("\n") <= 200
    assert 'pip install -e ".[examples]" && python examples/train_digits.py' in readme
    assert 'pip install -e ".[test]" && python -m pytest' in readme
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert 'pip install -e ".[test]" && python -m pytest' in ci  # CI runs README's command


# The pages' code and the site's build run once in CI, on its newest Python (e2e): CI's 20
# minutes have no room for both; the guides were run on JAX 0.10 and 0.12 when written.
@pytest.mark.e2e
@pytest.mark.parametrize("page", [p for p in DOCS if blocks(Path(ROOT, p))])
def test_the_python_blocks_of_a_page_run(page):
    done = run_page(Path(ROOT, page))
    assert done.returncode == 0, f"{page}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"


def test_a_blocks_printed_output_is_compared_with_the_text_block_after_it(tmp_path):
    # the guides' printed outputs had drifted from the code (a shuffle made exact) while their
    # blocks still ran: the text block after a python block is now what it must print
    page = tmp_path / "page.md"
    page.write_text("```python\nprint('pid', 4321, 'rows', [1, 2])\n```\n\nprose\n\n"
                    "```text\npid ... rows  [1, 2]\n```\n\n```python\nprint(3)\n```\n\n"
                    "```text\n4\n```\n\n```python\nprint(5)\n```\n\n"
                    "```{code-block} text\nshown, not compared\n```\n")
    assert [want for _, _, want in blocks(page)] == ["pid ... rows  [1, 2]\n", "4\n", None]
    done = run_page(page)
    assert done.returncode == 1, done.stderr
    assert "the block at line 12: its output differs" in done.stderr and "line 2:" not in \
        done.stderr and "Expected:\n    4\nGot:\n    3" in done.stderr, done.stderr


@pytest.mark.e2e
def test_the_site_builds_without_a_warning_and_documents_every_public_name(tmp_path):
    # -W: a warning fails the build; nitpicky (docs/conf.py): so does a reference to a jaxloader
    # name that is not documented. No network: no inventories are fetched.
    done = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-W", "--keep-going", "-b",
                           "html", "-d", str(tmp_path / "doctrees"), os.path.join(ROOT, "docs"),
                           str(tmp_path / "html")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr[-5000:]
    api = "".join(p.read_text() for p in (tmp_path / "html" / "api").glob("*.html"))
    missing = [name for name in jaxloader.__all__ if f'id="jaxloader.{name}"' not in api]
    assert not missing, f"not in the API reference (docs/api/): {missing}"
    assert "Alias for field number" not in api  # (a named tuple's fields: each says what it is)
    for name in ("JitMap.run", "Stream.reader", "ConcatSource.locate", "WorkerInfo.__new__",
                 "LoaderIterator.__init__", "Source.__init__", "Shard.__init__",
                 "ArraySource.check_mapped", "Mixture.check_phases", "MapSource.record_origin"):
        assert f'id="jaxloader.{name}"' not in api, name  # (what the loader calls, not a user)
    for name in ("jaxloader.checkpoint.LoaderSave", "jaxloader.ray.RayWorkers",
                 "jaxloader.DataLoader.state_dict", "jaxloader.DataLoader.diagnose"):
        assert f'id="{name}"' in api, name
    for page in ("index", "getting_started", "guides/checkpointing", "migrating/pytorch",
                 "troubleshooting"):
        assert (tmp_path / "html" / f"{page}.html").exists(), page


def test_every_test_named_slow_exists():
    # a renamed test would leave the fast check without notice
    from conftest import _SLOW

    missing = []
    for nodeid in sorted(_SLOW):
        path, _, name = nodeid.partition("::")
        text = open(os.path.join(ROOT, path), encoding="utf-8").read() \
            if os.path.exists(os.path.join(ROOT, path)) else ""
        name = name.split("::")[0].rsplit(".", 1)[-1]  # (a docstring's example: its class
        # or function; a TestCase made by hypothesis: a name assigned)
        if not re.search(rf"^(\s*(async def|def|class) {re.escape(name)}\b|{re.escape(name)} =)",
                         text, re.M):
            missing.append(nodeid)
    assert not missing, f"tests/slow_tests.txt names tests that are not there: {missing}"


def test_the_examples_of_the_public_names_run_with_jl_alone():
    """The API pages assume ``import jaxloader as jl`` and nothing else; the docstrings' own
    doctests run with their module's names (``ArraySource``, ``np``, ``ocp``), so 20 of the
    examples a reader copies failed with a NameError (the API audit)."""
    import doctest

    import jaxloader.checkpoint as checkpoint

    named = {name: getattr(jaxloader, name) for name in jaxloader.__all__}
    named.update({f"checkpoint.{name}": getattr(checkpoint, name) for name in checkpoint.__all__})
    finder = doctest.DocTestFinder(recurse=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    failed = []
    for name, obj in named.items():
        for test in finder.find(obj, name, globs={}):
            if test.examples and test.name.startswith(name):  # (its own, not an import's)
                test.globs = {"jl": jaxloader}
                said: list[str] = []
                if runner.run(test, out=said.append, clear_globs=True).failed:
                    failed.append(f"{test.name}: {''.join(said)[-400:]}")
    assert not failed, "\n".join(failed)
