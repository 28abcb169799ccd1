"""RunConfig, the whole run (one field per section), and its round trip through plain JSON:
`to_dict` / `from_dict`, and `field_defaults` for resuming a run directory written before a
field existed."""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

from scalerl_jax.config.checks import ConfigError, _positive
from scalerl_jax.config.data import DataConfig, DomainConfig, RewardConfig
from scalerl_jax.config.evaluation import EvalConfig, ForecastConfig
from scalerl_jax.config.model import MeshConfig, ModelConfig, RopeScaling
from scalerl_jax.config.sampling import PipelineConfig, SamplerConfig
from scalerl_jax.config.training import LossConfig, OptimConfig, SFTConfig


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    mesh: MeshConfig = MeshConfig()
    sampler: SamplerConfig = SamplerConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    pipeline: PipelineConfig = PipelineConfig()
    data: DataConfig = DataConfig()
    reward: RewardConfig = RewardConfig()
    eval: EvalConfig = EvalConfig()
    workdir: str = "runs/default"
    seed: int = 0
    steps: int = 1000
    checkpoint_every: int = 50
    keep_checkpoints: int = 3
    keep_every: Optional[int] = None  # also keep every M-th step permanently
    hf_checkpoint: Optional[str] = None  # initial weights (HF directory); None: random init
    sft: Optional[SFTConfig] = None  # supervised warm-up before RL (from hf_checkpoint or init)
    forecast: ForecastConfig = ForecastConfig()  # online sigmoid forecast at each evaluation
    max_skipped_steps: int = 5  # stop after this many consecutive non-finite steps

    def __post_init__(self):
        c = "RunConfig"
        _positive(
            c,
            steps=self.steps,
            checkpoint_every=self.checkpoint_every,
            keep_checkpoints=self.keep_checkpoints,
            max_skipped_steps=self.max_skipped_steps,
        )
        if self.keep_every is not None:
            _positive(c, keep_every=self.keep_every)

    def to_dict(self) -> dict:
        """Plain JSON types (tuples as lists), equal to what config.json reads back."""
        out = json.loads(json.dumps(dataclasses.asdict(self)))
        if not self.data.domains:  # one source: the dict of before mixtures
            del out["data"]["domains"]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def from_dict(cls, data: dict):
    """Rebuild a (nested) config dataclass from `to_dict()` output; unknown keys are an error."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}")
    kwargs = {}
    for name, value in data.items():
        sub = _NESTED.get((cls, name))
        if sub is None or value is None:
            kwargs[name] = value
        elif isinstance(value, (list, tuple)):  # a tuple of sections, e.g. DataConfig.domains
            kwargs[name] = tuple(from_dict(sub, v) for v in value)
        else:
            kwargs[name] = from_dict(sub, value)
    return cls(**kwargs)


_NESTED = {
    (ModelConfig, "rope_scaling"): RopeScaling,
    (RunConfig, "model"): ModelConfig,
    (RunConfig, "mesh"): MeshConfig,
    (RunConfig, "sampler"): SamplerConfig,
    (RunConfig, "loss"): LossConfig,
    (RunConfig, "optim"): OptimConfig,
    (RunConfig, "pipeline"): PipelineConfig,
    (RunConfig, "data"): DataConfig,
    (DataConfig, "domains"): DomainConfig,
    (RunConfig, "reward"): RewardConfig,
    (RunConfig, "eval"): EvalConfig,
    (RunConfig, "sft"): SFTConfig,
    (RunConfig, "forecast"): ForecastConfig,
    (SFTConfig, "optim"): OptimConfig,
}


def field_defaults(cls=None, prefix: str = "") -> dict:
    """{dotted path: default, as JSON} of every field with a default, sections walked. A run
    directory started before a field existed resumes when the field keeps its default
    (rundir.check_config)."""
    cls = RunConfig if cls is None else cls
    out = {}
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        sub = _NESTED.get((cls, f.name))
        if (
            sub is not None
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ):
            out.update(field_defaults(sub, path + "."))
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(value):
            out.update(field_defaults(type(value), path + "."))
            value = dataclasses.asdict(value)  # type: ignore[arg-type]  # a default, not a class
        out[path] = json.loads(json.dumps(value))
    return out
