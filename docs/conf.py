"""Sphinx configuration of jaxloader's documentation site (MyST Markdown, the book theme of
JAX's, Flax's and Orbax's sites). Build: ``python -m sphinx -W -b html docs docs/_build/html``.

No network at build time: no intersphinx inventories; references to jaxloader's own names are
checked (nitpicky), others (NumPy, JAX, the standard library) are left as plain text."""

import os
import sys
from typing import Any

sys.path.insert(0, os.path.abspath(".."))  # the package from this checkout, installed or not

project = "jaxloader"
author = "the jaxloader developers"
copyright = "2026, the jaxloader developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",  # the docstrings' Args:/Example: sections
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_templates", "screenshots"]
templates_path = ["_templates"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links, as GitHub renders them

autosummary_generate = True
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_class_signature = "separated"  # the class, then __init__'s parameters
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# A broken reference to a jaxloader name fails the build (-W); names of other libraries and
# jaxloader's internal types in signatures are not cross-referenced (no inventories offline).
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!jaxloader\.).*"), (r"py:.*", r"jaxloader\.[a-z_]+\..*")]

html_theme = "sphinx_book_theme"
html_title = "jaxloader"
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "use_download_button": False,
}
html_static_path: list[str] = []

# What a loader calls on its parts, not what a user calls, is left off the API pages (the API
# audit: JitMap.run, Stream.reader or ConcatSource.locate read as a user's to call), and so is
# a named tuple's __new__ (its fields are listed), and the __init__ of a class a user is given
# and never makes (the iterator) or only subclasses (a Protocol's, typing's stand-in).
_INTERNAL = {"block_starts", "check_alike", "check_extra_state", "check_mapped", "check_order",
             "check_phases", "compared_settings", "describe", "engine", "extra_state", "file_identities", "fresh",
             "gather_columns", "label", "locate", "older_fingerprints", "reader",
             "record_origin", "run", "settings", "split", "stop_work", "__new__"}
_NOT_MADE = {"LoaderIterator.__init__", "_no_init_or_replace_init"}


def _skip_internal(app: object, what: str, name: str, obj: object, skip: bool,
                   options: object) -> bool | None:
    if what == "class" and name == "__init__":
        return True if getattr(obj, "__qualname__", "") in _NOT_MADE else None
    return True if what == "class" and name in _INTERNAL else None


def setup(app: Any) -> None:
    app.connect("autodoc-skip-member", _skip_internal)
