"""Run an RL job: the SFT warm-up when the recipe has one, then RL, then the scaling fit.

The program: scalerl_jax/cli/run.py, installed as `scalerl-run`; `--help` says how.
"""

import sys

from scalerl_jax.cli.run import main

if __name__ == "__main__":
    sys.exit(main())
