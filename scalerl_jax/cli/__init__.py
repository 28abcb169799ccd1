"""The command-line programs, installed as `scalerl-run`, `scalerl-eval`, `scalerl-fit`,
`scalerl-allocate` and `scalerl-fetch-model` (pyproject.toml); experiments/*.py call the same
`main`s from a checkout."""
