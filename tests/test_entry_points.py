"""The programs are package code: pyproject.toml's commands name callables of scalerl_jax.cli,
each experiments/ script calls one of them, and no script edits sys.path to find the package."""

import ast
import glob
import importlib
import os
import re
import tomllib

from test_run import ROOT


def _commands() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def test_every_command_is_a_function_of_the_package():
    commands = _commands()
    assert {"scalerl-run", "scalerl-eval", "scalerl-fit"} <= set(commands)
    for name, target in commands.items():
        module, _, function = target.partition(":")
        assert module.startswith("scalerl_jax.cli."), (name, target)
        assert callable(getattr(importlib.import_module(module), function)), (name, target)


def test_every_experiments_script_calls_a_command():
    targets = {t.partition(":")[0] for t in _commands().values()}
    scripts = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")))
    assert scripts
    for path in scripts:
        tree = ast.parse(open(path).read())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert any(m in targets for m in imported), (path, imported)
        defined = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not defined, f"{path}: the program's code belongs in scalerl_jax/cli/"


def test_no_script_edits_sys_path():
    edit = re.compile(r"sys\.path\.(insert|append|extend)\(|sys\.path\s*(\+)?=")
    for folder in ("experiments", "bench", "tpu"):
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
            for i, line in enumerate(open(path), 1):
                assert not edit.search(line), f"{path}:{i}: {line.strip()}"
