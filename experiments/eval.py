"""Evaluate a model on a dataset: greedy pass@1, sampled mean@k and pass@k.

The program: scalerl_jax/cli/eval.py, installed as `scalerl-eval`; `--help` says how.
"""

import sys

from scalerl_jax.cli.eval import main

if __name__ == "__main__":
    sys.exit(main())
