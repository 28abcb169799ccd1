"""Runs the Python snippets of README.md and docs/*.md that are marked to run, so the docs
cannot drift from the code.

A marked block is a ```` ```python ```` fence right after a `<!-- test: run -->` line (an HTML
comment: invisible on GitHub and in the built pages). Options after a comma:
`continues` runs the page's previous marked blocks first, in the same process, for a block that
uses their names; `needs CKPT` first sets `CKPT` to a tiny Hugging Face checkpoint built here.
Each block runs in its own process with a time limit, compiled under its page's name and line
numbers, so a traceback points at the page.
"""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- test: run((?:, [A-Za-z ]+)*) -->")
OPTIONS = ("continues", "needs CKPT")
TIMEOUT_S = 180  # a snippet takes seconds; the margin is for a busy 2-core machine
# The pages whose examples the README and tests promise are tested: losing a marker fails here.
EXPECTED_PAGES = {"README.md", "docs/losses.md", "docs/real-models.md", "docs/scaling.md"}

RUNNER = """\
import json, sys
ns = {"__name__": "__main__"}
for name, first_line, code in json.load(open(sys.argv[1])):
    # Leading newlines make the traceback's line numbers the page's.
    exec(compile("\\n" * (first_line - 1) + code, name, "exec"), ns)
"""


@dataclasses.dataclass(frozen=True)
class Snippet:
    page: str  # relative to the repository root
    line: int  # the page's line of the snippet's first code line
    code: str
    continues: bool
    needs_ckpt: bool

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list:
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if "_build" not in p.parts]
    return [ROOT / "README.md", *docs]


def parse(path: pathlib.Path) -> tuple:
    """(snippets, problems) of one page; a problem is a malformed marker, named by its line."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text().split("\n")
    snippets, problems = [], []
    for i, line in enumerate(lines):
        if not line.startswith("<!-- test:"):
            continue
        m = MARKER.fullmatch(line.strip())
        options = [o.strip() for o in m.group(1).split(",") if o.strip()] if m else []
        unknown = [o for o in options if o not in OPTIONS]
        if m is None or unknown:
            problems.append(f"{page}:{i + 1}: malformed marker {line!r} (options: {OPTIONS})")
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```python":
            problems.append(f"{page}:{i + 1}: the marker is not followed by a ```python fence")
            continue
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            problems.append(f"{page}:{i + 2}: the python fence is never closed")
            continue
        snippets.append(
            Snippet(
                page,
                i + 3,
                "\n".join(lines[i + 2 : end]) + "\n",
                "continues" in options,
                "needs CKPT" in options,
            )
        )
    return snippets, problems


def collect() -> tuple:
    snippets, problems = [], []
    for path in pages():
        s, p = parse(path)
        snippets += s
        problems += p
    return snippets, problems


SNIPPETS, PROBLEMS = collect()


def chain(snippet: Snippet) -> list:
    """The snippet and, when it continues, the marked blocks before it on its page."""
    on_page = [s for s in SNIPPETS if s.page == snippet.page]
    k = on_page.index(snippet)
    start = k
    while on_page[start].continues and start > 0:
        start -= 1
    return on_page[start : k + 1]


@pytest.mark.fast
def test_markers_are_well_formed():
    assert not PROBLEMS, "\n".join(PROBLEMS)
    assert EXPECTED_PAGES <= {s.page for s in SNIPPETS}
    assert not any(s.continues for s in SNIPPETS if s is chain(s)[0]), (
        "a `continues` block needs a marked block before it on its page"
    )


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """A tiny random Llama saved by transformers (as tests/test_hf.py builds them)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    path = tmp_path_factory.mktemp("docs_ckpt")
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_snippet_runs(snippet, request, tmp_path):
    pieces = []
    if any(s.needs_ckpt for s in chain(snippet)):
        ckpt = request.getfixturevalue("hf_checkpoint")
        pieces.append(["<CKPT from tests/test_docs.py>", 1, f"CKPT = {ckpt!r}\n"])
    pieces += [[s.page, s.line, s.code] for s in chain(snippet)]
    program = tmp_path / "pieces.json"
    program.write_text(json.dumps(pieces))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    try:
        # cwd: a scratch directory, so a snippet that writes files leaves nothing in the checkout.
        done = subprocess.run(
            [sys.executable, "-c", RUNNER, str(program)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{snippet.where}: the snippet ran past {TIMEOUT_S} s")
    if done.returncode != 0:
        pytest.fail(
            f"{snippet.where}: the snippet failed (exit {done.returncode}):\n{done.stderr[-4000:]}",
            pytrace=False,
        )


def test_readme_links_exist():
    """The README is not part of the Sphinx build, which checks the pages' own links."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert targets, "the README links into docs/"
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
