"""Renamed public modules: the old import path still works (it is the new module) and warns;
nothing in the repository imports an old path; one verifier table."""

import ast
import importlib
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RENAMED = {
    "scalerl_jax.rl.losses": ("scalerl_jax.rl.objectives", "cispo_loss"),
    "scalerl_jax.data.synthetic": ("scalerl_jax.data.synthetic_tasks", "CharTokenizer"),
    "scalerl_jax.rewards.synthetic": ("scalerl_jax.rewards.exact_match", "verify_exact"),
    "scalerl_jax.scaling.synthetic": ("scalerl_jax.scaling.synthetic_curves", "make_curves"),
}


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_old_path_is_the_new_module_with_a_warning(old):
    new, name = RENAMED[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} was renamed {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    parent, _, leaf = old.rpartition(".")
    assert getattr(sys.modules[parent], leaf) is module
    assert callable(getattr(module, name))


def _imported_modules(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def test_nothing_in_the_repository_imports_an_old_path():
    aliases = {os.path.join(ROOT, *old.split(".")) + ".py" for old in RENAMED}
    found = []
    for top in ("scalerl_jax", "experiments", "bench", "tools", "tpu", "tests"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                path = os.path.join(dirpath, f)
                if not f.endswith(".py") or path in aliases or path == os.path.abspath(__file__):
                    continue
                found += [f"{path}: {m}" for m in _imported_modules(path) if m in RENAMED]
    assert not found, found


def test_one_verifier_table_and_the_old_names_tuple():
    from scalerl_jax import config
    from scalerl_jax.rewards import verifiers

    assert verifiers.NAMED_VERIFIERS is config.NAMED_VERIFIERS
    for name in config.NAMED_VERIFIERS:
        assert callable(verifiers.verifier_by_name(name))
    with pytest.warns(DeprecationWarning, match="VERIFIER_NAMES is deprecated"):
        assert config.VERIFIER_NAMES == tuple(config.NAMED_VERIFIERS) == ("math", "code", "exact")
