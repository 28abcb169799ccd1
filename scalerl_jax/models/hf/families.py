"""The table of HF model families and the four operations that dispatch through it:
`config_from_hf` (by the checkpoint's architecture), `architecture_of`, `config_to_hf` and
`tensor_map` (by the config's features).

A family is a module with:
  MODEL_TYPES               {config.json model_type: HF architectures name} it reads;
  claims(cfg)               whether a ModelConfig has this family's features (see FAMILIES);
  config_fields(hf, arch)   the ModelConfig fields but `name` of a config.json dict, refusing
                            what the model code does not implement (HFError naming the key);
  architecture(cfg)         the HF class it exports cfg as (HFError when cfg has none);
  config_to_hf(cfg, arch)   that class's config.json dict;
  tensor_map(cfg)           the `Entry` list the loader and the exporter share.
"""

from __future__ import annotations

import os
from typing import Optional

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.hf import llama, llama4, qwen3_moe
from scalerl_jax.models.hf.config_json import HFError, read_hf_config
from scalerl_jax.models.hf.entries import Entry

# A config belongs to the last family here whose `claims(cfg)` holds: each family refines an
# earlier one (Qwen3-MoE adds experts to the dense decoder; Llama-4 its own features to MoE).
FAMILIES = (llama, qwen3_moe, llama4)
_MODEL_TYPES = {t: arch for family in FAMILIES for t, arch in family.MODEL_TYPES.items()}
SUPPORTED_ARCHITECTURES = tuple(_MODEL_TYPES.values())
_FAMILY_OF_ARCHITECTURE = {
    arch: family for family in FAMILIES for arch in family.MODEL_TYPES.values()
}


def _family(cfg: ModelConfig):
    return next(family for family in reversed(FAMILIES) if family.claims(cfg))


def _dir_name(path_or_dict) -> Optional[str]:
    if isinstance(path_or_dict, dict):
        return None
    path = os.path.abspath(os.fspath(path_or_dict))
    return os.path.basename(path if os.path.isdir(path) else os.path.dirname(path))


def _architecture(hf: dict) -> str:
    archs = hf.get("architectures") or []
    arch = archs[0] if archs else _MODEL_TYPES.get(hf.get("model_type"), hf.get("model_type"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise HFError(
            f"unsupported architecture {arch!r} (config.json architectures={archs}, "
            f"model_type={hf.get('model_type')!r}); supported: {SUPPORTED_ARCHITECTURES}"
        )
    return str(arch)  # one of SUPPORTED_ARCHITECTURES


def config_from_hf(path_or_dict, **overrides) -> ModelConfig:
    """ModelConfig from an HF `config.json` (a checkpoint directory, the file, or its dict).

    `overrides` replace fields afterwards (e.g. `param_dtype="bfloat16"`). Features this decoder
    does not implement (output-projection or MLP biases, sliding windows, other activations or
    RoPE types) fail here rather than loading into a silently different model.
    """
    hf = read_hf_config(path_or_dict)
    arch = _architecture(hf)
    name = hf.get("_name_or_path") or _dir_name(path_or_dict) or arch
    fields = dict(_FAMILY_OF_ARCHITECTURE[arch].config_fields(hf, arch), name=name)
    fields.update(overrides)
    return ModelConfig(**fields)


def architecture_of(cfg: ModelConfig) -> str:
    """The HF class that has exactly this config's features."""
    return _family(cfg).architecture(cfg)


def config_to_hf(cfg: ModelConfig) -> dict:
    family = _family(cfg)
    return family.config_to_hf(cfg, family.architecture(cfg))


def tensor_map(cfg: ModelConfig) -> list[Entry]:
    return _family(cfg).tensor_map(cfg)
