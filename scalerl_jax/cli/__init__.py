"""The command-line programs, installed as `scalerl-run`, `scalerl-eval`, `scalerl-fit`,
`scalerl-allocate` and `scalerl-fetch-model` (pyproject.toml); experiments/*.py call the same
`main`s from a checkout."""

import argparse


def parser(doc: str) -> argparse.ArgumentParser:
    """A command's parser from its module docstring: the first line describes it, the text
    after the blank line under it is the epilog, printed as written."""
    return argparse.ArgumentParser(
        description=doc.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=doc.split("\n", 2)[2],
    )
