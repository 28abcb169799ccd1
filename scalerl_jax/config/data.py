"""What the run reads and how it is scored: DataConfig (one prompt source, or a mixture of
DomainConfig sections), the {data_source} / {data_dir} placeholders of sources that follow the
RL data, and RewardConfig (how verifiers run)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Optional

from scalerl_jax.config.checks import ConfigError, _check, _choice, _positive

# The verifiers a reward or domain may name (RewardConfig.verifier, DomainConfig.verifier), as
# importable paths that rewards.verifiers imports when used; any other verifier is given as
# "package.module:function".
NAMED_VERIFIERS = {
    "math": "scalerl_jax.rewards.math:verify_math",
    "code": "scalerl_jax.rewards.code:verify_code",
    "exact": "scalerl_jax.rewards.exact_match:verify_exact",
}
MIXTURE = "mixture"  # DataConfig.source of a multi-domain run
# How a row's reference answer is read from its answer field (data/answers.py).
ANSWER_FORMATS = ("raw", "gsm8k", "boxed")
# How an SFT demonstration's completion field becomes its target text (data/answers.py).
COMPLETION_FORMATS = ("raw", "gsm8k")
# Placeholders of a source that follows the RL data (DataConfig.validation_source,
# SFTConfig.source): data.source itself, and the directory holding it.
SOURCE_PLACEHOLDERS = ("{data_source}", "{data_dir}")


def _check_placeholders(cls: str, field: str, value: str) -> None:
    unknown = sorted(set(re.findall(r"\{[A-Za-z_]+\}", value)) - set(SOURCE_PLACEHOLDERS))
    _check(
        not unknown,
        cls,
        field,
        value,
        f"unknown placeholder(s) {unknown}; known: {list(SOURCE_PLACEHOLDERS)}",
    )


def resolve_source(value: str, data_source: str, field: str) -> str:
    """`value` with {data_source} (the RL data's DataConfig.source) and {data_dir} (the
    directory holding it; the directory itself when it is one) filled in."""
    if "{data_dir}" in value:
        if data_source == MIXTURE or data_source.startswith(("hf:", "tfds:", "synthetic:")):
            raise ConfigError(
                f"{field}={value!r}: {{data_dir}} needs a local data.source (a "
                f"file or directory), not {data_source!r}; give the path itself"
            )
        folder = data_source if os.path.isdir(data_source) else os.path.dirname(data_source)
        value = value.replace("{data_dir}", folder or ".")
    return value.replace("{data_source}", data_source)


@dataclasses.dataclass(frozen=True)
class DomainConfig:
    """One domain of a data mixture (DataConfig.domains): its own source, field mapping, share
    of the training prompts (`weight`, relative to the other domains'), verifier and number of
    held-out validation prompts. `num_validation` / `template` / `system_prompt` of None use
    DataConfig's; `answer_format` and `validation_source` mean what DataConfig's do (there they
    stay at their defaults in a mixture), {data_dir} being this domain's source's directory.
    `verifier`: "math", "code", "exact" or "package.module:function"; None picks one by source
    (synthetic tasks: their own, else math)."""

    name: str
    source: str = ""
    weight: float = 1.0
    verifier: Optional[str] = None
    split: str = "train"
    prompt_field: str = "problem"
    answer_field: str = "answer"
    id_field: Optional[str] = "id"
    num_validation: Optional[int] = None
    template: Optional[str] = None
    system_prompt: Optional[str] = None
    answer_format: str = "raw"
    validation_source: Optional[str] = None

    def __post_init__(self):
        c = f"DomainConfig[{self.name!r}]"
        # The name keys metrics ("per_domain.NAME") and overrides (data.domains.NAME.weight=2).
        _check(
            bool(re.fullmatch(r"[A-Za-z0-9_-]+", str(self.name))),
            "DomainConfig",
            "name",
            self.name,
            "must be a non-empty word of letters, digits, '_' or '-'",
        )
        _check(
            bool(self.source),
            c,
            "source",
            self.source,
            f"must be non-empty (set data.domains.{self.name}.source=...)",
        )
        _check(
            isinstance(self.weight, (int, float))
            and math.isfinite(self.weight)
            and self.weight > 0,
            c,
            "weight",
            self.weight,
            "must be a finite number > 0",
        )
        if self.verifier is not None:
            _check(
                self.verifier in NAMED_VERIFIERS or ":" in self.verifier,
                c,
                "verifier",
                self.verifier,
                f"must be one of {tuple(NAMED_VERIFIERS)} or 'package.module:function'",
            )
        if self.num_validation is not None:
            _check(
                self.num_validation >= 0, c, "num_validation", self.num_validation, "must be >= 0"
            )
        if self.template is not None:
            _check(
                self.template == "chat" or "{prompt}" in self.template,
                c,
                "template",
                self.template,
                "must be 'chat' or contain '{prompt}'",
            )
        _choice(c, "answer_format", self.answer_format, ANSWER_FORMATS)
        if self.validation_source is not None:
            _check(
                bool(self.validation_source),
                c,
                "validation_source",
                self.validation_source,
                "must be a source or none",
            )
            _check_placeholders(c, "validation_source", self.validation_source)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Prompt source. `source` is a local .jsonl/.parquet path, `hf:NAME_OR_DIR`, `tfds:NAME`,
    or `synthetic:TASK` for the CPU testbed; or "mixture" with `domains` set: several sources
    drawn by weight (data/mixture.py). In a mixture each domain has its own source and field
    mapping, so the single-source fields (split, prompt_field, answer_field, id_field,
    answer_format, validation_source) must keep their defaults; num_validation (each domain's
    default), template, system_prompt, max_bad_fraction, validation_split and seed are shared.

    Validation: `num_validation` rows of `source` are held out (ranked by a hash of their id),
    or, with `validation_source` set (e.g. "{data_dir}/test.jsonl": GSM8K's test file beside
    its train.jsonl), the held-out prompts come from that source instead (the first
    `num_validation` of its rows in the same hash order; all of them when it has fewer) and
    every row of `source` trains, except rows whose problem is also a validation prompt."""

    source: str = "synthetic:arithmetic"
    split: str = "train"
    prompt_field: str = "problem"
    answer_field: str = "answer"
    id_field: Optional[str] = "id"  # stable prompt ids (curriculum); absent: hash of the prompt
    template: str = "{prompt}"  # or "chat": the tokenizer's chat template
    system_prompt: Optional[str] = None
    num_validation: int = 1000
    max_bad_fraction: float = 0.01
    seed: int = 0
    domains: tuple[DomainConfig, ...] = ()  # a mixture (source="mixture"); () for one source
    # How the reference answer is read from `answer_field` (data/answers.py): "raw" the text as
    # it is; "gsm8k" the number after the last "####" (GSM8K's worked solutions), thousands
    # separators removed; "boxed" the content of the last \boxed{} (MATH-style solutions). A
    # row whose answer cannot be read so is skipped and counted like any malformed row.
    answer_format: str = "raw"
    # Held-out prompts from their own source (see the docstring); "{data_dir}" / "{data_source}"
    # stand for the directory of `source` / `source` itself. Read as its `validation_split`
    # (the split of an hf: / tfds: source, or the files of a directory whose names hold it).
    validation_source: Optional[str] = None
    validation_split: str = "test"

    def __post_init__(self):
        c = "DataConfig"
        _check(bool(self.source), c, "source", self.source, "must be non-empty")
        _choice(c, "answer_format", self.answer_format, ANSWER_FORMATS)
        if self.validation_source is not None:
            _check(
                bool(self.validation_source),
                c,
                "validation_source",
                self.validation_source,
                "must be a source or none (hold num_validation rows out of `source`)",
            )
            _check_placeholders(c, "validation_source", self.validation_source)
        _check(
            bool(self.validation_split),
            c,
            "validation_split",
            self.validation_split,
            "must be non-empty",
        )
        _check(self.num_validation >= 0, c, "num_validation", self.num_validation, "must be >= 0")
        _check(
            0 <= self.max_bad_fraction < 1,
            c,
            "max_bad_fraction",
            self.max_bad_fraction,
            "must be in [0, 1)",
        )
        _check(
            self.template == "chat" or "{prompt}" in self.template,
            c,
            "template",
            self.template,
            "must be 'chat' or contain '{prompt}'",
        )
        object.__setattr__(self, "domains", tuple(self.domains))  # JSON lists: hashable tuple
        _check_domains(self)

    @property
    def is_mixture(self) -> bool:
        return bool(self.domains)

    def sources(self) -> tuple[str, ...]:
        """Every source the run reads: the domains' in a mixture, else (source,)."""
        return tuple(d.source for d in self.domains) if self.domains else (self.source,)

    def validation_path(self) -> Optional[str]:
        """`validation_source` with its placeholders filled in; None when unset."""
        if self.validation_source is None:
            return None
        return resolve_source(self.validation_source, self.source, "DataConfig.validation_source")

    def domain_data(self, name: str) -> "DataConfig":
        """Domain `name` as a single-source DataConfig (its fields, the shared ones from here)."""
        d = next((d for d in self.domains if d.name == name), None)
        if d is None:
            raise ConfigError(
                f"DataConfig.domains has no domain {name!r}; domains: "
                f"{[d.name for d in self.domains]}"
            )
        return DataConfig(
            source=d.source,
            split=d.split,
            prompt_field=d.prompt_field,
            answer_field=d.answer_field,
            id_field=d.id_field,
            template=self.template if d.template is None else d.template,
            system_prompt=self.system_prompt if d.system_prompt is None else d.system_prompt,
            num_validation=self.num_validation if d.num_validation is None else d.num_validation,
            max_bad_fraction=self.max_bad_fraction,
            seed=self.seed,
            answer_format=d.answer_format,
            validation_source=d.validation_source,
            validation_split=self.validation_split,
        )


def _check_domains(cfg: DataConfig) -> None:
    """A mixture's domains: DomainConfigs with unique names, source "mixture", and no
    per-domain field set on the mixture itself."""
    c = "DataConfig"
    domains = cfg.domains
    for d in domains:
        _check(isinstance(d, DomainConfig), c, "domains", d, "items must be DomainConfig")
    names = [d.name for d in domains]
    repeated = sorted({n for n in names if names.count(n) > 1})
    _check(not repeated, c, "domains", names, f"domain names must be unique; repeated: {repeated}")
    if not domains:
        _check(
            cfg.source != MIXTURE,
            c,
            "source",
            cfg.source,
            "a mixture needs DataConfig.domains (e.g. data.domains.math.source=...)",
        )
        return
    _check(
        cfg.source == MIXTURE,
        c,
        "source",
        cfg.source,
        f"must be {MIXTURE!r} when domains are set (each domain has its own source: "
        f"{dict(zip(names, (d.source for d in domains)))})",
    )
    for f in dataclasses.fields(cfg):
        if f.name in _PER_DOMAIN:
            _check(
                getattr(cfg, f.name) == f.default,
                c,
                f.name,
                getattr(cfg, f.name),
                f"a mixture sets this per domain (data.domains.NAME.{f.name}); leave "
                f"it at its default {f.default!r}",
            )


_PER_DOMAIN = (
    "split",
    "prompt_field",
    "answer_field",
    "id_field",
    "answer_format",
    "validation_source",
)


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """Verifier execution. Rewards run on a host pool; a crash or timeout scores as failure."""

    workers: int = 8
    timeout_s: float = 10.0
    # Spawned child-process workers, killed and replaced when an item runs past timeout_s (a
    # thread stuck in SymPy cannot be stopped). None: automatic (rewards.use_processes), i.e.
    # processes for every verifier except the exact-match one of synthetic tasks.
    processes: Optional[bool] = None
    require_think_close: bool = False  # no `</think>` -> no answer (templates that open <think>)
    verifier: Optional[str] = None  # "math" / "code" / "exact" / "package.module:function";
    # None: by data source (one source; a mixture sets DomainConfig.verifier)
    # Code rewards' sandbox (rewards/sandbox.py): "strong" needs bubblewrap and refuses to run
    # code without it; "best" accepts the weak mode where bubblewrap is missing; "weak" always.
    code_isolation: str = "strong"

    def __post_init__(self):
        _positive("RewardConfig", workers=self.workers, timeout_s=self.timeout_s)
        _check(
            self.code_isolation in ("strong", "best", "weak"),
            "RewardConfig",
            "code_isolation",
            self.code_isolation,
            "must be 'strong', 'best' or 'weak'",
        )
        _check(
            self.processes is None or isinstance(self.processes, bool),
            "RewardConfig",
            "processes",
            self.processes,
            "must be true, false or none (automatic)",
        )
        if self.verifier is not None:
            _check(
                self.verifier in NAMED_VERIFIERS or ":" in self.verifier,
                "RewardConfig",
                "verifier",
                self.verifier,
                f"must be one of {tuple(NAMED_VERIFIERS)} or 'package.module:function'",
            )
