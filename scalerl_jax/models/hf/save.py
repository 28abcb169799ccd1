"""Exporting params as an HF checkpoint (`export`): `config.json` + safetensors that
`transformers` loads.

Export gathers one parameter at a time and streams it into the safetensors file, whose header is
computed up front from shapes alone.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any, Optional

import jax
import numpy as np
from flax import nnx

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.hf.config_json import HFError
from scalerl_jax.models.hf.entries import Entry, half_split_order
from scalerl_jax.models.hf.families import config_to_hf, tensor_map

_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}


def _to_host(x) -> np.ndarray:
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _write_safetensors(file: str, entries: list, arrays_of) -> None:
    """Stream tensors into one safetensors file: the header is built from shapes, then each
    tensor is fetched (one at a time) and appended."""
    header, offset = {}, 0
    for e, dt in entries:
        nbytes = math.prod(e.hf_shape) * np.dtype(dt).itemsize
        header[e.hf_name] = {
            "dtype": _ST_DTYPES[np.dtype(dt).name],
            "shape": list(e.hf_shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data must start 8-byte aligned
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for e, dt in entries:
            f.write(np.ascontiguousarray(arrays_of(e), dtype=dt).tobytes())


class _Gatherer:
    """HF tensors from our params, gathered to the host one param (or layer row) at a time."""

    def __init__(self, cfg: ModelConfig, flat: dict, full_shapes: dict, pieces: dict):
        self.cfg, self.flat, self.full_shapes, self.pieces = cfg, flat, full_shapes, pieces
        # The last gathered param (row): its experts are written one by one.
        self.gathered: dict = {}

    def hf_array(self, e: Entry) -> np.ndarray:
        if e.part:
            parts = sorted(self.pieces[e.hf_name], key=lambda x: x.part[0])
            return np.concatenate([self.hf_piece(x) for x in parts], axis=-1)
        return self.hf_piece(e)

    def hf_piece(self, e: Entry) -> np.ndarray:
        flat, full_shapes, cfg, gathered = self.flat, self.full_shapes, self.cfg, self.gathered
        key = (e.path, e.layer[:1])
        if key not in gathered:
            value = (
                flat[e.path].get_value() if isinstance(flat[e.path], nnx.Variable) else flat[e.path]
            )
            if value.shape != full_shapes[e.path]:
                raise HFError(
                    f"param {'.'.join(map(str, e.path))}: shape {value.shape} != "
                    f"{full_shapes[e.path]} expected by config {cfg.name!r}"
                )
            gathered.clear()
            # A layer's row is cut out on the devices: the host holds one layer's tensor.
            gathered[key] = _to_host(value[e.layer[0]] if e.layer else value)
        ours = gathered[key]
        if e.expert >= 0:
            ours = ours[e.expert]
        split = ours.transpose(np.argsort(e.perm))
        if e.rope_axis >= 0:
            order = np.argsort(half_split_order(split.shape[e.rope_axis]))
            split = np.take(split, order, axis=e.rope_axis)
        return split.reshape(e.piece_shape)


def export(
    params,
    cfg: ModelConfig,
    out_dir,
    max_shard_bytes: int = 5_000_000_000,
    dtype=None,
    extra_config: Optional[dict[str, Any]] = None,
) -> list[str]:
    """Write `config.json` + safetensors (+ `model.safetensors.index.json` when sharded) that
    `transformers` loads. `params`: the nnx.State (sharded or not). Each parameter is gathered
    to the host on its own, so peak host memory is one tensor. In multi-process runs every
    process must call this (the gathers are collective); only process 0 writes.
    `extra_config` is merged into config.json (e.g. bos/eos token ids). Returns the files."""
    out_dir = os.fspath(out_dir)
    dt = np.dtype(dtype or cfg.param_dtype)
    entries = tensor_map(cfg)
    flat = dict(nnx.to_flat_state(params))
    missing = [e.path for e in entries if e.path not in flat]
    if missing:
        raise HFError(f"params lack {missing[:5]} required by config {cfg.name!r}")
    full_shapes = {e.path: e.param_shape for e in entries}
    entries = [one for e in entries for one in (e.per_expert() if e.experts else [e])]
    # Entries that are pieces of one HF tensor (Llama-4 gate_up_proj) are written as one.
    pieces: dict = {}
    for e in entries:
        if e.part:
            pieces.setdefault(e.hf_name, []).append(e)
    entries = [e for e in entries if not e.part or e.part[0] == 0]
    shards, names = _shards(entries, dt, max_shard_bytes)
    writer = jax.process_index() == 0
    if writer:
        os.makedirs(out_dir, exist_ok=True)

    hf_array = _Gatherer(cfg, flat, full_shapes, pieces).hf_array

    for name, shard in zip(names, shards):
        if writer:
            _write_safetensors(os.path.join(out_dir, name), shard, hf_array)
        else:  # the gathers are collectives: take part without writing
            for e, _ in shard:
                hf_array(e)
    if writer:
        _write_index_and_config(out_dir, cfg, dt, shards, names, extra_config)
    return [os.path.join(out_dir, n) for n in names]


def _shards(entries: list, dt: np.dtype, max_shard_bytes: int):
    """The entries cut into files of at most `max_shard_bytes` (a larger tensor alone), and
    the files' names."""
    shards: list[list[tuple[Entry, Any]]] = [[]]
    size = 0
    for e in entries:
        nbytes = math.prod(e.hf_shape) * dt.itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((e, dt))
        size += nbytes
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    return shards, names


def _write_index_and_config(out_dir, cfg: ModelConfig, dt, shards, names, extra_config) -> None:
    """`model.safetensors.index.json` (when sharded) and `config.json`."""
    if len(shards) > 1:
        total = sum(math.prod(e.hf_shape) * dt.itemsize for s in shards for e, _ in s)
        index = {
            "metadata": {"total_size": total},
            "weight_map": {e.hf_name: n for n, s in zip(names, shards) for e, _ in s},
        }
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
    hf_cfg = config_to_hf(cfg.replace(param_dtype=dt.name))
    hf_cfg.update(extra_config or {})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)
