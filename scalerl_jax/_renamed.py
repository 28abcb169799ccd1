"""Old module paths kept importable after a rename: the old name becomes the new module itself,
with a DeprecationWarning that points at the line importing the old name."""

from __future__ import annotations

import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
    """Called by the module `old` while it is imported: make `old` the module `new`."""
    module = importlib.import_module(new)
    # stacklevel 3: past this function and the alias module to the importing line (warnings
    # skips importlib's frames), so Python's default filter shows it for an import in __main__.
    warnings.warn(
        f"{old} was renamed {new}; import {new} instead", DeprecationWarning, stacklevel=3
    )
    sys.modules[old] = module
