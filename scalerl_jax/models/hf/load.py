"""Loading an HF checkpoint directory into sharded params (`load_params`).

Each tensor is read lazily (memory-mapped safetensors) and every parameter is built with
`jax.make_array_from_callback` in its target sharding: each device's callback reads exactly the
slice that device holds, so no full host copy of the model (nor of a tensor, per device) is made.
Expert weights are read from either checkpoint layout (one tensor per expert, or fused).
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
from typing import Any, Optional

import jax
import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy: safetensors' numpy reader needs it
import numpy as np
from flax import nnx

from scalerl_jax.config import DTYPES, ModelConfig
from scalerl_jax.models.hf import llama4
from scalerl_jax.models.hf.config_json import HFError
from scalerl_jax.models.hf.entries import Entry, half_split_order
from scalerl_jax.models.hf.families import architecture_of, config_from_hf, tensor_map
from scalerl_jax.models.transformer import Transformer


def _layout(entry: Entry, files: dict) -> str:
    """'plain', 'split' (one HF tensor per expert) or 'fused' (transformers 5 in-memory)."""
    if not entry.experts:
        return "plain"
    if entry.hf_name.format(e=0) in files:
        return "split"
    if entry.fused[0] in files:  # type: ignore[index]  # set on every expert entry
        return "fused"
    return "missing"


def _read_expert_slice(handles, files, entry: Entry, index: tuple, dtype) -> np.ndarray:
    """Our-layout block `index` ([experts, ...]) of a stacked expert param: only the experts
    in the block's range are read, from either checkpoint layout."""
    lo, hi = index[0].indices(entry.experts)[:2]
    if _layout(entry, files) == "split":
        parts = [
            _read_slice(handles[files[one.hf_name]], one, index[1:], dtype)
            for one in entry.per_expert()[lo:hi]
        ]
        return np.stack(parts) if parts else np.zeros((0,) + entry.shape[1:], dtype)
    name, part, _ = entry.fused  # type: ignore[misc]  # set on every expert entry
    n = entry.hf_shape[0]
    block = np.asarray(handles[files[name]].get_slice(name)[lo:hi, part * n : (part + 1) * n])
    split = [s for g in entry.groups for s in g]
    block = block.reshape((hi - lo, *split)).transpose((0, *(q + 1 for q in entry.perm)))
    return np.ascontiguousarray(block[(slice(None), *index[1:])], dtype=dtype)


def _is_ignorable(name: str, cfg: ModelConfig) -> bool:
    # Old checkpoints store RoPE buffers; tied checkpoints sometimes store the head anyway
    # (transformers ignores it then, and so do we).
    return name.endswith("rotary_emb.inv_freq") or (cfg.tie_embeddings and name == "lm_head.weight")


def _read_slice(handle, entry: Entry, index: tuple, dtype) -> np.ndarray:
    """Our-layout block `index` of `entry`, read from the checkpoint without reading the rest."""
    ranges = [sl.indices(n)[:2] for sl, n in zip(index, entry.shape)]
    split_ranges: list[Any] = [None] * len(ranges)
    for i, p in enumerate(entry.perm):
        split_ranges[p] = ranges[i]
    hf_index, block_shape, post, k = [], [], [], 0
    for g in entry.groups:
        # Only the leading sub-dim of a split HF dim maps to a contiguous HF range; inner
        # sub-dims (head_dim, never sharded by RULES) are read whole and sliced afterwards.
        (lo, hi), inner = split_ranges[k], math.prod(g[1:])
        hf_index.append(slice(lo * inner, hi * inner))
        block_shape += [hi - lo, *g[1:]]
        post += [slice(None)] + [slice(*split_ranges[k + j]) for j in range(1, len(g))]
        k += len(g)
    if entry.part:  # our piece starts part-index pieces into the HF tensor's last axis
        off = entry.part[0] * entry.piece_shape[-1]
        hf_index[-1] = slice(hf_index[-1].start + off, hf_index[-1].stop + off)
    block = np.asarray(handle.get_slice(entry.hf_name)[tuple(hf_index)]).reshape(block_shape)
    if entry.rope_axis >= 0:  # head_dim is read whole (see above), so it can be permuted
        order = half_split_order(block.shape[entry.rope_axis])
        block = np.take(block, order, axis=entry.rope_axis)
    block = block[tuple(post)].transpose(entry.perm)
    return np.ascontiguousarray(block, dtype=dtype)


def _checkpoint_files(path: str) -> dict[str, str]:
    """tensor name -> safetensors file."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise HFError(f"no *.safetensors files (nor model.safetensors.index.json) in {path}")
    from safetensors import safe_open

    out = {}
    for file in files:
        with safe_open(file, framework="numpy") as h:
            out.update({name: file for name in h.keys()})
    return out


def load_params(path, mesh=None, cfg: Optional[ModelConfig] = None, dtype=None):
    """(cfg, graphdef, params) from an HF checkpoint directory, each param in its mesh sharding.

    `cfg` defaults to `config_from_hf(path)`; `dtype` (e.g. "bfloat16") overrides its
    `param_dtype`. Without a mesh, params go to the first local device. All names and shapes are
    checked before any tensor is read. Host memory peaks at this host's blocks of one tensor
    (blocks replicated across devices are read once and shared).
    """
    from safetensors import safe_open

    from scalerl_jax import mesh as mesh_lib

    path = os.fspath(path)
    cfg = config_from_hf(path) if cfg is None else cfg
    if dtype is not None:
        cfg = cfg.replace(param_dtype=_dtype_name(dtype))
    files = _checkpoint_files(path)
    entries = tensor_map(cfg)
    # Only Llama-4 ships as a multimodal checkpoint whose language model this loads.
    if any(n.startswith(llama4.TEXT_PREFIX) for n in files):
        files, entries = llama4.language_model_only(files, entries, path, cfg)
    with contextlib.ExitStack() as stack:
        handles = {
            f: stack.enter_context(safe_open(f, framework="numpy"))
            for f in sorted(set(files.values()))
        }
        _check_names_and_shapes(entries, files, handles, cfg, path)
        abstract = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(params=0)))
        graphdef, state = nnx.split(abstract)
        if mesh is not None:
            shardings = dict(nnx.to_flat_state(mesh_lib.state_shardings(state, mesh)))
        else:
            one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        variables = dict(nnx.to_flat_state(state))
        np_dtype = np.dtype(cfg.param_dtype)

        def read(e: Entry, index: tuple) -> np.ndarray:
            if e.experts:
                return _read_expert_slice(handles, files, e, index, np_dtype)
            return _read_slice(handles[files[e.hf_name]], e, index, np_dtype)

        rows: dict[tuple, list[Entry]] = {}  # param path -> its entries (a layer stack's rows)
        for e in entries:
            rows.setdefault(e.path, []).append(e)
        for path_, group in rows.items():
            group.sort(key=lambda e: e.layer[0] if e.layer else 0)
            sharding = shardings[path_] if mesh is not None else one
            cache: dict = {}  # replicated shards read once per distinct block

            def block(index, group=group, cache=cache):
                shape = group[0].param_shape
                key = tuple(sl.indices(n)[:2] for sl, n in zip(index, shape))
                if key not in cache:
                    if group[0].layer:  # index[0]: the stacked layers' rows
                        lo, hi = key[0]
                        cache[key] = np.stack([read(e, index[1:]) for e in group[lo:hi]])
                    else:
                        cache[key] = read(group[0], index)
                return cache[key]

            value = jax.make_array_from_callback(group[0].param_shape, sharding, block)
            variables[path_].set_value(value)
    return cfg, graphdef, state


def _dtype_name(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise HFError(f"dtype {name!r} is not one of {DTYPES}")
    return name


def _check_names_and_shapes(entries, files, handles, cfg, path) -> None:
    plain: list[Entry] = []
    expected: set[str] = set()
    for e in entries:
        layout = _layout(e, files)
        if layout == "missing":
            raise HFError(
                f"missing expert tensors for {'.'.join(map(str, e.path))}: neither "
                f"{e.hf_name.format(e=0)!r} (per-expert) nor {e.fused[0]!r} (fused) "
                f"is in {path}"
            )
        if layout == "fused":
            name, _, parts = e.fused
            want = (e.experts, parts * e.hf_shape[0], e.hf_shape[1])
            got = tuple(handles[files[name]].get_slice(name).get_shape())
            if got != want:
                raise HFError(
                    f"tensor {name!r}: checkpoint shape {got} != expected shape "
                    f"{want} for config {cfg.name!r}"
                )
            expected.add(name)
        else:
            plain += e.per_expert() if layout == "split" else [e]
    expected.update(e.hf_name for e in plain)
    for e in plain:
        if e.hf_name not in files:
            raise HFError(f"missing tensor {e.hf_name!r} (expected shape {e.hf_shape}) in {path}")
        got = tuple(handles[files[e.hf_name]].get_slice(e.hf_name).get_shape())
        if got != e.hf_shape:
            raise HFError(
                f"tensor {e.hf_name!r}: checkpoint shape {got} != expected shape "
                f"{e.hf_shape} for config {cfg.name!r}"
            )
    extra = sorted(n for n in files if n not in expected and not _is_ignorable(n, cfg))
    if extra:
        shapes = {n: tuple(handles[files[n]].get_slice(n).get_shape()) for n in extra[:5]}
        raise HFError(
            f"unexpected tensors in {path} (not used by this {architecture_of(cfg)} "
            f"config): {len(extra)} e.g. {shapes}"
        )
