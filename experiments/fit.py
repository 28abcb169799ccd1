"""Fit the ScaleRL sigmoid law to runs' validation curves.

The program: scalerl_jax/cli/fit.py, installed as `scalerl-fit`; `--help` says how.
"""

import sys

from scalerl_jax.cli.fit import main

if __name__ == "__main__":
    sys.exit(main())
