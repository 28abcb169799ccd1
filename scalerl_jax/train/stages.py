"""The stages of a run around the RL loop: the SFT warm-up that makes the initial policy, and
at the end the export of the final policy as an HF checkpoint and the fit of the scaling curve.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Callable, Optional

import jax

from scalerl_jax import checkpoint as ckpt_lib
from scalerl_jax.config import RunConfig, SFTConfig
from scalerl_jax.models.tokenizer import copy_tokenizer_files
from scalerl_jax.multihost import barrier
from scalerl_jax.heartbeat import phase
from scalerl_jax.progress import SFT_FIELDS, Progress
from scalerl_jax.scaling import report
from scalerl_jax.tracking import Tracker
from scalerl_jax.train import sft as sft_lib

log = logging.getLogger(__name__)


def warm_up(
    cfg: RunConfig,
    sft: SFTConfig,
    mesh,
    tokenizer,
    validation,
    tracker: Tracker,
    on_trained: Optional[Callable[[int], None]] = None,
) -> str:
    """The SFT stage (reused when WORKDIR/sft is complete); returns its HF model directory.
    `on_trained(step)` after each step (the stop line says how many an exit would lose)."""
    out = os.path.join(cfg.workdir, "sft")
    if sft_lib.is_done(out):
        return sft_lib.model_dir(out)
    tracker.purge("sft", 0)
    with (
        Progress(
            "sft",
            sft.steps,
            fields=SFT_FIELDS,
            tokens_key="tokens",
            enabled=None if jax.process_index() == 0 else False,
        ) as bar,
        phase("SFT warm-up", total=sft.steps, unit="steps") as shown,
    ):

        def on_step(step, metrics):
            bar.update(step, metrics)
            shown.update(step)
            tracker.write({"event": "sft", "step": step, **metrics})

        return sft_lib.run_sft(
            sft,
            cfg.model,
            cfg.data,
            mesh,
            tokenizer,
            out_dir=out,
            seed=cfg.seed,
            exclude=validation,
            hf_checkpoint=cfg.hf_checkpoint,
            logprob_chunk=sft.optim.logprob_chunk,
            on_step=on_step,
            on_trained=on_trained,
        )


def export(params, model_cfg, tokenizer, cfg: RunConfig) -> str:
    """WORKDIR/model: the policy as an HF checkpoint (written beside, then renamed into place),
    with the tokenizer files of the checkpoint the run started from. Collective."""
    out = os.path.join(cfg.workdir, "model")
    partial = out + ".partial"
    with phase(f"exporting the final policy to {out}", announce=True):
        if jax.process_index() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        ckpt_lib.export_hf(
            params, model_cfg, partial, extra_config={"eos_token_id": int(tokenizer.eos_id)}
        )
        if jax.process_index() == 0:
            copy_tokenizer_files(cfg.hf_checkpoint, partial)
            shutil.rmtree(out, ignore_errors=True)
            os.replace(partial, out)
    barrier("model_written")
    return out


def fit(workdir: str) -> tuple[Optional[dict], Optional[str], dict]:
    """Fit the run's own validation curve (and a mixture's per-domain curves) into
    WORKDIR/fit; (headline, None, domain headlines) or (None, why, ...)."""
    try:
        analysis, files = report.fit_run_dir(workdir)
    except (ValueError, KeyError, FileNotFoundError) as err:
        return None, str(err), {}
    log.info("scaling fit written to %s", os.path.dirname(files[0]))
    return (
        report.headline(analysis),
        None if analysis.fit.ok else analysis.fit.reason,
        report.domain_headlines(analysis),
    )
