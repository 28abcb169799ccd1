"""Load a script of the repository (bench/, experiments/, tools/, tpu/) as a module by its path:
they are entry points, not package modules, so tests cannot import them by name."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(relpath: str, name: str):
    """The module at ROOT/relpath, executed under `name`."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
