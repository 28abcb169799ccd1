"""The commands of README.md and docs/ as a user runs them after the README's set-up: each one
printed in a ```bash block or an inline `python experiments/...` span. Only data a user can get
is named (no path into this machine's own folders), the README says how the `python` of its
commands is found before it first uses one, and the cheap commands (--help, --dry-run,
--recipe list) run as printed, in a fresh process whose environment is an activated .venv (the
test's interpreter's bin/ first on PATH) and nothing of the test's own (no PYTHONPATH)."""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHEAP = ("--help", "--dry-run", "--recipe list")
ACTIVATE = ". .venv/bin/activate"


def pages() -> list:
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if "_build" not in p.parts]
    return [ROOT / "README.md", *docs]


def commands(path: pathlib.Path) -> list:
    """[(line number, command)] of a page: lines of ```bash blocks (continuations joined,
    comments dropped) and inline spans starting with `python experiments/`."""
    found, block, pending = [], False, ""
    for i, line in enumerate(path.read_text().split("\n"), 1):
        if line.strip().startswith("```"):
            block = line.strip() == "```bash"
            continue
        if block:
            text = pending + line.split(" #", 1)[0].strip()
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            if text:
                found.append((i, text, line.split(" #", 1)[1:]))
        else:
            found += [(i, m, []) for m in re.findall(r"`(python experiments/[^`]+)`", line)]
    return found


def cheap():
    out = []
    for page in pages():
        for line, cmd, comment in commands(page):
            if cmd.startswith("python experiments/") and any(c in cmd for c in CHEAP):
                status = 2 if comment and "exit 2" in comment[0] else 0
                out.append(pytest.param(cmd, status, id=f"{page.name}:{line}"))
    return out


def test_no_page_names_a_folder_a_clone_lacks():
    for page in pages():
        for line, cmd, _ in commands(page):
            assert "../shared" not in cmd, f"{page.name}:{line}: {cmd}"
        assert "../shared" not in page.read_text(), page.name


def test_the_readme_says_where_python_comes_from_before_using_it():
    text = (ROOT / "README.md").read_text()
    first = text.index("\npython experiments/")
    assert ACTIVATE in text[:first] and "make setup" in text[:first]
    assert ACTIVATE in (ROOT / "docs" / "getting-started.md").read_text()
    assert len(cheap()) >= 3  # the commands below exist


@pytest.mark.parametrize("cmd,status", cheap())
def test_a_cheap_command_runs_as_printed(cmd, status):
    bin_dir = os.path.dirname(sys.executable)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "VIRTUAL_ENV": os.path.dirname(bin_dir),
        "HOME": os.environ.get("HOME", "/tmp"),
        "JAX_PLATFORMS": "cpu",
    }
    done = subprocess.run(
        shlex.split(cmd), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == status, (done.stdout + done.stderr)[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
