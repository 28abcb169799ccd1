"""The tensor-name map between an HF checkpoint and our params: `Entry` (one HF tensor <-> one
param, with the reshape/transpose between their layouts) and the Llama-style decoder skeleton
that every family's `tensor_map` fills in.

Layouts: HF linear weights are [out, in]; ours are [in, ..., out] with heads split out, e.g.
`q_proj.weight` [H*hd, D] <-> `q` [D, H, hd].
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.transformer import layer_period, layer_position


@dataclasses.dataclass(frozen=True)
class Entry:
    """One HF tensor <-> one of our params: ours = hf.reshape(concat(groups)).transpose(perm),
    where HF dim j splits into the sizes `groups[j]` (e.g. H*hd -> (H, hd))."""

    hf_name: str
    path: tuple
    groups: tuple
    perm: tuple
    # MoE expert weights: our param stacks `experts` HF tensors along a leading axis; hf_name
    # holds `{e}` and groups/perm describe one expert's tensor. `fused` = (name, part, parts):
    # the transformers-5 in-memory layout, [E, parts * n, m] with this weight at rows part * n.
    experts: int = 0
    fused: Optional[tuple[str, int, int]] = None
    expert: int = -1  # export only: this HF tensor is expert `expert` of our param
    # (i, n): ours is the i-th of n equal pieces of the HF tensor's last axis (Llama-4's fused
    # gate_up_proj); groups describe the piece.
    part: tuple = ()
    # Split-HF axis holding head_dim in Llama-4's interleaved RoPE order (-1: none): permuted
    # to the half-split order at load, back at export.
    rope_axis: int = -1
    # (g, n): ours is row g of a param stacked over n layers (Transformer's scanned layers);
    # `shape` is then one row's shape.
    layer: tuple = ()

    @property
    def param_shape(self) -> tuple:
        """The shape of our whole param (the stack of n rows for a layer's entry)."""
        return (self.layer[1],) + self.shape if self.layer else self.shape

    @property
    def piece_shape(self) -> tuple:
        return tuple(math.prod(g) for g in self.groups)

    @property
    def hf_shape(self) -> tuple:
        shape = self.piece_shape
        return shape[:-1] + (shape[-1] * self.part[1],) if self.part else shape

    @property
    def shape(self) -> tuple:
        split = [s for g in self.groups for s in g]
        one = tuple(split[p] for p in self.perm)
        return (self.experts,) + one if self.experts else one

    def per_expert(self) -> list["Entry"]:
        """One plain entry per expert (hub layout)."""
        return [
            dataclasses.replace(
                self, hf_name=self.hf_name.format(e=e), experts=0, fused=None, expert=e
            )
            for e in range(self.experts)
        ]


def half_split_order(head_dim: int) -> np.ndarray:
    """Interleaved RoPE dims (2i, 2i+1) -> half-split (i, i + hd/2): ours = hf[..., order]."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def decoder_entries(
    cfg: ModelConfig,
    ffn: str,
    moe_entries: Optional[Callable[[ModelConfig, str, tuple], list[Entry]]],
    rope_axis: int = -1,
) -> list[Entry]:
    """The entries of a Llama-style decoder. A family supplies its feed-forward prefix (`ffn`),
    the entries of its MoE layers (`moe_entries(cfg, prefix, our_path)`) and, for interleaved
    RoPE checkpoints, the q/k axis to permute (`Entry.rope_axis`)."""
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.dim_per_head
    entries = [
        Entry("model.embed_tokens.weight", ("embed",), ((v,), (d,)), (0, 1)),
        Entry("model.norm.weight", ("final_norm", "scale"), ((d,),), (0,)),
    ]
    if not cfg.tie_embeddings:
        entries.append(Entry("lm_head.weight", ("lm_head",), ((v,), (d,)), (1, 0)))
    period = layer_period(cfg)
    for i in range(cfg.num_layers):
        (j, g), p = layer_position(cfg, i), f"model.layers.{i}."
        us = ("layers", j)
        layer = [
            Entry(p + "input_layernorm.weight", us + ("attn_norm", "scale"), ((d,),), (0,)),
            Entry(p + "post_attention_layernorm.weight", us + ("mlp_norm", "scale"), ((d,),), (0,)),
            Entry(
                p + "self_attn.q_proj.weight",
                us + ("attn", "q"),
                ((h, hd), (d,)),
                (2, 0, 1),
                rope_axis=rope_axis,
            ),
            Entry(
                p + "self_attn.k_proj.weight",
                us + ("attn", "k"),
                ((kv, hd), (d,)),
                (2, 0, 1),
                rope_axis=rope_axis,
            ),
            Entry(p + "self_attn.v_proj.weight", us + ("attn", "v"), ((kv, hd), (d,)), (2, 0, 1)),
            Entry(p + "self_attn.o_proj.weight", us + ("attn", "o"), ((d,), (h, hd)), (1, 2, 0)),
        ]
        if cfg.is_moe_layer(i):
            # A family with MoE layers passes moe_entries; config_from_hf refuses the others.
            layer += moe_entries(cfg, p + ffn, us + ("mlp",))  # type: ignore[misc]
        else:
            layer += mlp_entries(p + ffn, us + ("mlp",), d, f)
        if cfg.qkv_bias:
            layer += [
                Entry(p + "self_attn.q_proj.bias", us + ("attn", "q_bias"), ((h, hd),), (0, 1)),
                Entry(p + "self_attn.k_proj.bias", us + ("attn", "k_bias"), ((kv, hd),), (0, 1)),
                Entry(p + "self_attn.v_proj.bias", us + ("attn", "v_bias"), ((kv, hd),), (0, 1)),
            ]
        if cfg.qk_norm:
            layer += [
                Entry(
                    p + "self_attn.q_norm.weight", us + ("attn", "q_norm", "scale"), ((hd,),), (0,)
                ),
                Entry(
                    p + "self_attn.k_norm.weight", us + ("attn", "k_norm", "scale"), ((hd,),), (0,)
                ),
            ]
        n = cfg.num_layers // period
        entries += [dataclasses.replace(e, layer=(g, n)) for e in layer]
    return entries


def mlp_entries(p: str, us: tuple, d: int, f: int) -> list[Entry]:
    return [
        Entry(p + "gate_proj.weight", us + ("gate",), ((f,), (d,)), (1, 0)),
        Entry(p + "up_proj.weight", us + ("up",), ((f,), (d,)), (1, 0)),
        Entry(p + "down_proj.weight", us + ("down",), ((d,), (f,)), (1, 0)),
    ]
