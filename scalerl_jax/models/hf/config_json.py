"""The `config.json` pieces every HF family shares: the error type, reading the file, required
keys, RoPE settings (both transformers spellings) and the attention shape."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional, Union

from scalerl_jax.config import ModelConfig, RopeScaling
from scalerl_jax.errors import UserError


class HFError(UserError, ValueError):
    """An HF checkpoint does not fit: unknown architecture, missing/unexpected tensor, bad shape."""


def read_hf_config(path_or_dict: Union[str, os.PathLike, dict]) -> dict:
    if isinstance(path_or_dict, dict):
        return dict(path_or_dict)
    path = os.fspath(path_or_dict)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.exists(path):
        raise HFError(f"no HF config at {path}")
    with open(path) as f:
        return json.load(f)


def required(hf: dict, key: str):
    if hf.get(key) is None:
        raise HFError(f"config.json has no {key!r} (keys: {sorted(hf)})")
    return hf[key]


def rope(hf: dict) -> tuple[float, Optional[RopeScaling]]:
    # transformers < 5 writes `rope_theta` + `rope_scaling`; >= 5 writes `rope_parameters`
    # (holding rope_theta too). Either may be absent or null.
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        raise HFError(
            f"rope type {kind!r} is not supported (only 'default' and 'llama3'); "
            f"rope settings: {params}"
        )
    return theta, RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )


def attention_dims(hf: dict) -> tuple:
    d, heads = int(required(hf, "hidden_size")), int(required(hf, "num_attention_heads"))
    head_dim = hf.get("head_dim")
    if head_dim is not None and int(head_dim) == d // heads and d % heads == 0:
        head_dim = None  # the default; keeps configs equal to the presets
    return d, heads, None if head_dim is None else int(head_dim)


def rope_scaling_to_hf(cfg: ModelConfig) -> Optional[dict]:
    if cfg.rope_scaling is None:
        return None
    return dict(rope_type="llama3", **dataclasses.asdict(cfg.rope_scaling))
