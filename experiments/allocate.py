"""Compute allocation: from short runs of different settings, the one to run at a budget.

The program: scalerl_jax/cli/allocate.py, installed as `scalerl-allocate`; `--help` says how.
"""

import sys

from scalerl_jax.cli.allocate import main

if __name__ == "__main__":
    sys.exit(main())
