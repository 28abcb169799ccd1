"""Run configuration: frozen dataclasses, validated on construction.

Every config error names the field and the offending value, so a typo in an experiment file fails
at start-up with a sentence, not deep inside a jitted function. Configs are plain data: the RL
math never receives them (it takes static scalars), which keeps the losses importable on their own.

    from scalerl_jax.config import RunConfig, ModelConfig, apply_overrides, ...

  checks.py      ConfigError and the field checks every section validates with
  model.py       ModelConfig (dense and MoE decoders, RopeScaling), MeshConfig
  sampling.py    SamplerConfig (generation, interruptions), PipelineConfig (off-policy mode)
  training.py    LossConfig (objective), OptimConfig (AdamW), SFTConfig (supervised warm-up)
  data.py        DataConfig and its DomainConfig mixtures, source placeholders, RewardConfig
  evaluation.py  EvalConfig (held-out validation), ForecastConfig (online curve forecast)
  run.py         RunConfig, to_dict / from_dict, field_defaults
  overrides.py   apply_overrides: `section.field=value` from the command line
"""

from scalerl_jax.config.checks import ConfigError
from scalerl_jax.config.data import (
    ANSWER_FORMATS,
    COMPLETION_FORMATS,
    MIXTURE,
    NAMED_VERIFIERS,
    SOURCE_PLACEHOLDERS,
    DataConfig,
    DomainConfig,
    RewardConfig,
    resolve_source,
)
from scalerl_jax.config.evaluation import EvalConfig, ForecastConfig
from scalerl_jax.config.model import (
    ATTENTION_IMPLS,
    DTYPES,
    REMAT_POLICIES,
    MeshConfig,
    ModelConfig,
    RopeScaling,
)
from scalerl_jax.config.overrides import apply_overrides
from scalerl_jax.config.run import RunConfig, field_defaults, from_dict
from scalerl_jax.config.sampling import PipelineConfig, SamplerConfig
from scalerl_jax.config.training import (
    ADVANTAGE_NORMS,
    AGGREGATIONS,
    LOSS_OBJECTIVES,
    LossConfig,
    OptimConfig,
    SFTConfig,
)

__all__ = [
    "ADVANTAGE_NORMS",
    "AGGREGATIONS",
    "ANSWER_FORMATS",
    "ATTENTION_IMPLS",
    "COMPLETION_FORMATS",
    "DTYPES",
    "LOSS_OBJECTIVES",
    "MIXTURE",
    "NAMED_VERIFIERS",
    "REMAT_POLICIES",
    "SOURCE_PLACEHOLDERS",
    "ConfigError",
    "DataConfig",
    "DomainConfig",
    "EvalConfig",
    "ForecastConfig",
    "LossConfig",
    "MeshConfig",
    "ModelConfig",
    "OptimConfig",
    "PipelineConfig",
    "RewardConfig",
    "RopeScaling",
    "RunConfig",
    "SFTConfig",
    "SamplerConfig",
    "apply_overrides",
    "field_defaults",
    "from_dict",
    "resolve_source",
]


def __getattr__(name: str):
    # Renamed: the verifier names are the keys of the one verifier table.
    if name == "VERIFIER_NAMES":
        import warnings

        warnings.warn(
            "scalerl_jax.config.VERIFIER_NAMES is deprecated; use tuple(NAMED_VERIFIERS)",
            DeprecationWarning,
            stacklevel=2,
        )
        return tuple(NAMED_VERIFIERS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
