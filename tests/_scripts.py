"""Load a script of the repository (bench/, tools/, tpu/) as a module by its path: they are
entry points, not package modules, so tests cannot import them by name."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(relpath: str, name: str):
    """The module at ROOT/relpath, executed under `name`. Its folder goes on sys.path, as when
    it runs as `python relpath`, for its imports of sibling scripts (there or in functions);
    last, so that no script shadows a module of the same name for the other tests."""
    path = os.path.join(ROOT, relpath)
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
