"""Checks of a command line's inputs that need neither devices nor compilation: the HF
checkpoint directory, the data source and its columns, the verifier, the workdir, the local
devices, and whether the run is already complete. `experiments/run.py` calls them before
anything slow starts, so a user error is one line naming the flag, the value and what would work.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib
import importlib.util
import json
import logging
import os
from typing import Optional

from scalerl_jax import plan
from scalerl_jax.config import ConfigError, ModelConfig, apply_overrides, field_defaults
from scalerl_jax.data.prompts import DataError
from scalerl_jax.errors import UserError

log = logging.getLogger(__name__)


class UsageError(UserError, ValueError):
    """A flag or its value cannot work. The message names the flag, the value and what would."""


def flag_for(args, given, key: str) -> str:
    """How the user set a value: the flag, else the override, else the recipe."""
    if given:
        return given
    if any(o.partition("=")[0].strip() == key for o in args.overrides):
        return key
    return f"--recipe {args.recipe} ({key})"


def hf_checkpoint(given: str, *, weights: bool = True) -> str:
    """The local HF directory for `--hf-checkpoint GIVEN`: the directory itself, a Hub id's
    snapshot (only config and tokenizer without `weights`), or a .gguf file's conversion
    (models/fetch.py)."""
    from scalerl_jax.models import fetch

    try:
        return fetch.resolve(given, weights=weights)
    except fetch.FetchError as err:
        raise UsageError(f"--hf-checkpoint {given}: {err}") from None


def hf_model(
    path: str, like: ModelConfig, *, given: Optional[str] = None, weights: bool = True
) -> ModelConfig:
    """The model of the HF directory `path` (resolved from `--hf-checkpoint given`) with the
    recipe's dtypes. Without `weights` (a plan) the safetensors need not be there yet."""
    flag = f"--hf-checkpoint {given or path}" + (f" ({path})" if given and given != path else "")
    if not os.path.isdir(path):
        raise UsageError(
            f"{flag}: no such directory (an HF model directory holds config.json, "
            "tokenizer.json and *.safetensors)"
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UsageError(f"{flag}: no config.json there; files: {sorted(os.listdir(path))[:10]}")
    if weights and not glob.glob(os.path.join(path, "*.safetensors")):
        raise UsageError(f"{flag}: no *.safetensors weights there")
    if not any(
        os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer.model")
    ) and not glob.glob(os.path.join(path, "*.model")):
        raise UsageError(f"{flag}: no tokenizer.json or SentencePiece *.model there")
    from scalerl_jax.models import hf

    try:  # the recipe's dtypes, head precision and execution choices; the checkpoint's shapes
        return hf.config_from_hf(path).replace(
            param_dtype=like.param_dtype,
            compute_dtype=like.compute_dtype,
            fp32_head=like.fp32_head,
            remat=like.remat,
            remat_policy=like.remat_policy,
            attention_chunk=like.attention_chunk,
            attention_impl=like.attention_impl,
        )
    except (hf.HFError, ConfigError, ValueError) as err:
        raise UsageError(f"{flag}: {err}") from None


# ------------------------------------------------------------------------- input checks
_PROMPT_NAMES = ("problem", "question", "prompt", "query", "input", "instruction")
_ANSWER_NAMES = ("answer", "solution", "final_answer", "ground_truth", "target", "output")


def _first_file(path: str, split: str) -> str:
    if not os.path.isdir(path):
        return path
    exts = (".jsonl", ".json", ".parquet")
    files = sorted(
        f for f in glob.glob(os.path.join(path, "**", "*"), recursive=True) if f.endswith(exts)
    )
    return next((f for f in files if split in os.path.basename(f)), files[0] if files else "")


def _columns(path: str) -> list:
    """Top-level field names of the first record of a local .jsonl / .json / .parquet file."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    with open(path, encoding="utf-8", errors="replace") as fh:
        head = fh.read(1 << 12).lstrip()
        fh.seek(0)
        records = (
            json.load(fh)
            if path.endswith(".json") and head.startswith("[")
            else (json.loads(line) for line in fh if line.strip())
        )
        first = next(iter(records), None)
    return list(first) if isinstance(first, dict) else []


def check_data(data, flag: str, *, read: bool) -> list[str]:
    """The prompt source (and its validation source, when it has one) exists and (with `read`)
    has the configured columns. Without `read` (--dry-run) what only the run needs comes back
    as notes."""
    notes = _check_source(data, flag, read=read)
    if data.validation_source is not None:
        try:
            path = data.validation_path()
        except ConfigError as err:
            raise UsageError(str(err)) from None
        held_out = dataclasses.replace(
            data, source=path, split=data.validation_split, validation_source=None
        )
        notes += _check_source(
            held_out, f"data.validation_source={data.validation_source} ->", read=read
        )
    return notes


def _check_synthetic(data, flag: str, *, read: bool) -> None:
    from scalerl_jax.data import synthetic_tasks

    src = data.source
    task = src[len("synthetic:") :].partition("?")[0]
    if task not in synthetic_tasks.TASKS:
        raise UsageError(
            f"{flag} {src}: unknown synthetic task {task!r}; known: "
            f"{', '.join(synthetic_tasks.TASKS)}"
        )
    if read:  # knobs and sizes: generating the rows takes about a second
        from scalerl_jax.data.prompts import load_rows

        try:
            load_rows(data)
        except DataError as err:
            raise UsageError(f"{flag} {src}: {str(err).split(': ', 1)[-1]}") from None


def _check_columns(data, flag: str, file: str) -> None:
    """The prompt and answer fields must be columns of the file."""
    src = data.source
    try:
        columns = _columns(file)
    except Exception as err:  # noqa: BLE001 - pyarrow and json raise many types
        raise UsageError(
            f"{flag} {src}: cannot read {file} ({type(err).__name__}: {str(err)[:200]})"
        ) from None
    missing = [
        (key, field, names)
        for key, field, names in (
            ("data.prompt_field", data.prompt_field, _PROMPT_NAMES),
            ("data.answer_field", data.answer_field, _ANSWER_NAMES),
        )
        if field.split(".")[0] not in columns
    ]
    if missing:
        fix = " ".join(
            f"{key}=" + next((c for c in names if c in columns), "COLUMN")
            for key, _, names in missing
        )
        what = " nor ".join(f"{field!r} ({key})" for key, field, _ in missing)
        raise UsageError(
            f"{flag} {src}: no column {what}; its columns are {columns}: map them with {fix}"
        )


def _check_source(data, flag: str, *, read: bool) -> list[str]:
    src = data.source
    if src.startswith("synthetic:"):
        _check_synthetic(data, flag, read=read)
        return []
    for prefix, package, extra in (
        ("hf:", "datasets", "data"),
        ("tfds:", "tensorflow_datasets", "tfds"),
    ):
        if src.startswith(prefix):
            local = src[len(prefix) :]
            if local.startswith((os.sep, ".", "~")) and not os.path.exists(local):
                raise UsageError(f"{flag} {src}: no such file or directory {local}")
            if importlib.util.find_spec(package) is None:
                why = (
                    f"{flag} {src}: needs the `{package}` package, which is not installed "
                    f"(pip install 'scalerl_jax[{extra}]')"
                )
                if read:
                    raise UsageError(why)
                return [why]
            return []
    if not os.path.exists(src):
        raise UsageError(
            f"{flag} {src}: no such file or directory (expected a local .jsonl / "
            ".json / .parquet file or directory, hf:NAME, tfds:NAME or "
            "synthetic:TASK)"
        )
    file = _first_file(src, data.split)
    if not file:
        raise UsageError(f"{flag} {src}: the directory holds no .jsonl / .json / .parquet files")
    if not file.endswith((".jsonl", ".json", ".parquet")):
        raise UsageError(f"{flag} {src}: unsupported file type; use .jsonl, .json or .parquet")
    if not os.access(file, os.R_OK):
        raise UsageError(f"{flag} {src}: {file} is not readable (permissions)")
    if read:
        _check_columns(data, flag, file)
    return []


def _check_tokenizer(cfg, args, data_flag: str, *, dry_run: bool) -> list[str]:
    """Synthetic tasks use the character tokenizer; text prompts need --hf-checkpoint's."""
    synthetic = all(src.startswith("synthetic:") for src in cfg.data.sources())
    if synthetic and cfg.hf_checkpoint:
        raise UsageError(
            f"--hf-checkpoint {cfg.hf_checkpoint} with {data_flag} "
            f"{cfg.data.source}: synthetic tasks use the testbed's character "
            "tokenizer, not the checkpoint's; give the HF model a text dataset "
            "(--data FILE.jsonl / FILE.parquet / hf:NAME)"
        )
    if not synthetic and not cfg.hf_checkpoint:
        why = (
            f"{data_flag} {cfg.data.source}: text prompts need a tokenizer, and only "
            "synthetic:TASK sources use the built-in character tokenizer: add "
            "--hf-checkpoint DIR (an HF model directory: tokenizer and initial weights)"
        )
        if not dry_run:
            raise UsageError(
                why
                + (
                    ", e.g. --recipe scalerl --hf-checkpoint DIR"
                    if args.recipe == "testbed"
                    else ""
                )
            )
        return [
            "a real run needs --hf-checkpoint DIR: text prompts need its tokenizer "
            "(only synthetic:TASK sources use the built-in character tokenizer)"
        ]
    return []


def _check_sft(cfg) -> None:
    try:
        sft_source = cfg.sft.source_for(cfg.data)  # "{data_source}": the --data file
    except ConfigError as err:
        raise UsageError(str(err)) from None
    if not sft_source.startswith("synthetic:") and not os.path.exists(sft_source):
        shown = cfg.sft.source + ("" if sft_source == cfg.sft.source else f" -> {sft_source}")
        raise UsageError(f"sft.source={shown}: no such file or directory")


def _check_verifier(cfg) -> None:
    module, _, name = cfg.reward.verifier.partition(":")
    try:
        ok = callable(getattr(importlib.import_module(module), name, None))
    except ImportError as err:
        raise UsageError(
            f"reward.verifier={cfg.reward.verifier}: cannot import {module} ({err})"
        ) from None
    if not ok:
        raise UsageError(
            f"reward.verifier={cfg.reward.verifier}: {module} has no function {name!r}"
        )


def _check_workdir(cfg) -> None:
    parent = os.path.abspath(cfg.workdir)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise UsageError(f"--workdir {cfg.workdir}: {parent} is not a writable directory")


def check_inputs(cfg, args, *, dry_run: bool) -> list[str]:
    """Every check that needs neither devices nor compilation; returns notes for --dry-run
    (what a real run would refuse but a plan does not need)."""
    data_flag = flag_for(args, "--data" if args.data else None, "data.source")
    if cfg.data.is_mixture:  # each domain's source, as its own single-source config
        notes = [
            note
            for d in cfg.data.domains
            for note in check_data(
                cfg.data.domain_data(d.name), f"data.domains.{d.name}.source", read=not dry_run
            )
        ]
    else:
        notes = check_data(cfg.data, data_flag, read=not dry_run)
    notes += _check_tokenizer(cfg, args, data_flag, dry_run=dry_run)
    if cfg.sft is not None:
        _check_sft(cfg)
    if cfg.reward.verifier:
        _check_verifier(cfg)
    if args.wandb and importlib.util.find_spec("wandb") is None:
        raise UsageError(
            f"--wandb {args.wandb}: the `wandb` package is not installed (pip install wandb)"
        )
    _check_workdir(cfg)
    return notes


# ------------------------------------------------------------------------------------ sizes
PLANNED_LOCALLY = ("optim.micro_batches", "model.remat", "sampler.max_concurrent_decodes")


def size_for_platform(
    recipe: str,
    cfg,
    pinned,
    notes: list,
    *,
    dry_run: bool,
    topo=None,
    platform: Optional[str] = None,
):
    """`cfg` with recipe `recipe`'s accelerator sizes (recipes.ACCELERATOR_SIZES: a bigger
    batch, longer generations) when the run is on an accelerator: the --tpu slice `topo`
    (whose planner, plan.resolve, then fits it), else this host's devices (`platform`, or
    jax's; call after check_devices), where the local plan's first fitting micro-batches,
    remat and decode slots are taken. The keys the command line set (`pinned`) keep their
    values. What changed goes to `notes` (--dry-run prints them) and, for a run, to the log."""
    from scalerl_jax import recipes

    if topo is not None:
        platform = f"tpu {topo.name}"
    elif platform is None:
        import jax

        platform = jax.local_devices()[0].platform
    if platform == "cpu":
        return cfg
    sized, applied = recipes.for_accelerator(recipe, cfg, pinned)
    if applied and topo is None:
        # The local plan re-plans what the TPU planner would (micro-batches, remat, decode
        # slots), never the lengths: those change the experiment.
        local = local_plan(sized)
        if local is not None and not local.fits:
            fix = plan.local.fitting_settings(sized, local.machine)
            keys = {item.partition("=")[0] for item in fix}
            if fix and keys <= set(PLANNED_LOCALLY) - set(pinned):
                sized = apply_overrides(sized, fix)
                applied = applied + fix
    if applied:
        note = (
            f"sized for {platform}: {' '.join(applied)} (recipe {recipe}'s accelerator "
            "sizes; set any as KEY=VALUE to pin it)"
        )
        notes.append(note)
        if not dry_run:
            log.info(note)
    return sized


# -------------------------------------------------------------------------------- devices
def check_devices(cfg, topo) -> None:
    """This machine can hold the meshes: the --tpu slice itself, or enough local devices."""
    import jax

    from scalerl_jax import mesh as mesh_lib

    env = dict(os.environ)
    tpu_vm = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    if (
        topo is not None
        and topo.hosts > 1
        and tpu_vm
        and not (env.get("SCALERL_COORDINATOR") or env.get("SCALERL_DISTRIBUTED"))
    ):
        env["SCALERL_DISTRIBUTED"] = "auto"  # a TPU pod worker: JAX finds its peers
    mesh_lib.maybe_initialize_distributed(env)
    if topo is not None:
        warning = plan.check_hardware(topo, jax.devices(), jax.process_count())
        if warning:
            log.warning(warning)
        return
    local = jax.local_devices()
    if not cfg.mesh.colocate and len(local) < 2:
        raise UsageError(
            f"{len(local)} {local[0].platform} device on this host, and the "
            "trainer and sampler need separate ones (mesh.colocate=false): pass "
            "--colocate (= mesh.colocate=true) to share it, or --tpu TOPOLOGY on "
            "a TPU slice"
        )
    try:
        split = mesh_lib.split_devices(cfg.mesh)
        mesh_lib.trainer_mesh(cfg.mesh, split.trainer)
        mesh_lib.sampler_mesh(cfg.mesh, split.sampler)
    except mesh_lib.MeshError as err:
        raise UsageError(
            f"mesh.*: {err} ({len(local)} local {local[0].platform} devices)"
        ) from None


def local_plan(cfg):
    """The memory plan of `cfg` on this host's devices (plan/local.py), or None when they report
    no memory figure (the run then goes ahead unchecked, with a warning)."""
    machine = plan.local.detect()
    if machine is None:
        log.warning(
            "these devices report no memory limit: the run's memory is not checked against them"
        )
        return None
    return plan.local.local_plan(cfg, machine)


def finished_step(cfg, allow_config_change: bool):
    """The newest committed checkpoint's step when the run is already complete, else None."""
    from scalerl_jax import rundir

    if not allow_config_change:  # a different config is refused, complete or not
        rundir.check_config(cfg.workdir, cfg.to_dict(), defaults=field_defaults())
    root = os.path.join(cfg.workdir, "checkpoints")
    steps = [
        int(n)
        for n in (os.listdir(root) if os.path.isdir(root) else [])
        if n.isdigit() and os.path.exists(os.path.join(root, n, rundir.MANIFEST))
    ]
    return max(steps) if steps and max(steps) >= cfg.steps else None


def complete_message(cfg, step: int) -> str:
    fit = os.path.join(cfg.workdir, "fit", "fit.txt")
    where = (
        f"its scaling fit: {fit}"
        if os.path.isfile(fit)
        else f"no scaling fit in it yet: python experiments/fit.py {cfg.workdir}"
    )
    return (
        f"run already complete at step {step} in {cfg.workdir} (--steps {cfg.steps}); "
        f"raise --steps above {step} to continue; {where}"
    )
