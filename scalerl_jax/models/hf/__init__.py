"""Hugging Face interop: `config.json` -> ModelConfig, safetensors -> sharded params, and back.

Modules: `families` (the table of model families and the dispatch through it), one module per
family (`llama`: Llama / Qwen2 / Qwen3, `qwen3_moe`, `llama4`) holding its config translation
and tensor-name map, `config_json` (config.json helpers the families share), `entries` (the
HF tensor <-> param layout type and the shared decoder skeleton), `load` (checkpoint -> sharded
params) and `save` (params -> checkpoint).

Adding a family means adding one module with the interface `families` describes (MODEL_TYPES,
claims, config_fields, architecture, config_to_hf, tensor_map) and registering it in
`families.FAMILIES`; loading and export need no change.
"""

from scalerl_jax.models.hf.config_json import HFError, read_hf_config
from scalerl_jax.models.hf.entries import half_split_order
from scalerl_jax.models.hf.families import (
    SUPPORTED_ARCHITECTURES,
    architecture_of,
    config_from_hf,
    config_to_hf,
    tensor_map,
)
from scalerl_jax.models.hf.load import _read_slice, load_params
from scalerl_jax.models.hf.save import export

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "HFError",
    "_read_slice",
    "architecture_of",
    "config_from_hf",
    "config_to_hf",
    "export",
    "half_split_order",
    "load_params",
    "read_hf_config",
    "tensor_map",
]
