"""Sphinx configuration: MyST pages, an API reference from the package's docstrings, furo.

`make docs` builds with warnings as errors, so a broken cross-reference, a missing page in the
toctree or a docstring the reST parser cannot read fails the build.
"""

import pathlib
import sys

# The API pages import the package; build from a checkout without installing it too.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

project = "scalerl_jax"
author = "scalerl_jax authors"
copyright = "2026, scalerl_jax authors"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # `page.md#a-heading` links, checked at build time

# Docstrings name arrays by their shape ([N, T]) and write ``code``: keep the source order and
# the signatures as written, and do not import JAX's docs to resolve its types.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "scalerl_jax"
