"""The objective registry: `@objective(name)` turns a per-token term into a full loss function.

A term is ``term(b, old_logp, *, <its hyper-parameters with defaults>) -> (pg_tok, metrics)``
on the prepared `loss_parts.Batch`; its keywords must be the objective's row of
``rl.hparams.OBJECTIVE_HPARAMS``. The registry wraps it once in what every objective shares: the
TIS check, `loss_parts.prepare` (shapes, weights, sanitising) and `loss_parts.finish` (KL,
entropy, aggregation, metrics). The resulting function keeps the public signature
``fn(logp, behaviour_logp, advantages, mask, prompt_index=None, *, aggregation, ...)``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from scalerl_jax.rl.hparams import OBJECTIVE_HPARAMS
from scalerl_jax.rl.loss_parts import check_tis, finish, prepare

# name -> full loss function, filled by @objective at import of rl.objectives / rl.ppo_clip.
LOSSES: dict[str, Callable[..., Any]] = {}

_P = inspect.Parameter


def _shared_signature(term_params) -> inspect.Signature:
    pos = [
        _P(n, _P.POSITIONAL_OR_KEYWORD) for n in ("logp", "behaviour_logp", "advantages", "mask")
    ]
    pos.append(_P("prompt_index", _P.POSITIONAL_OR_KEYWORD, default=None))
    kw = [_P("aggregation", _P.KEYWORD_ONLY, annotation=str)]
    kw += [_P(n, _P.KEYWORD_ONLY, default=None) for n in ("num_prompts", "max_length", "weights")]
    kw += [p.replace(kind=_P.KEYWORD_ONLY) for p in term_params]
    kw += [_P(n, _P.KEYWORD_ONLY, default=None) for n in ("old_logp", "ref_logp")]
    kw += [
        _P("kl_coef", _P.KEYWORD_ONLY, default=0.0),
        _P("kl_estimator", _P.KEYWORD_ONLY, default="k3"),
        _P("entropy", _P.KEYWORD_ONLY, default=None),
        _P("entropy_coef", _P.KEYWORD_ONLY, default=0.0),
    ]
    return inspect.Signature(pos + kw)


def make_loss(name: str, term: Callable[..., Any]) -> Callable[..., Any]:
    """The full loss function of `term` (unregistered; see `objective`). Long because the
    loss's shared signature and its prepare/finish calls are spelled out argument by argument."""
    term_params = [
        p for p in inspect.signature(term).parameters.values() if p.kind is _P.KEYWORD_ONLY
    ]
    defaults = {p.name: p.default for p in term_params}
    who = f"objective={name!r}"

    def loss(
        logp,
        behaviour_logp,
        advantages,
        mask,
        prompt_index=None,
        *,
        aggregation: str,
        num_prompts=None,
        max_length=None,
        weights=None,
        old_logp=None,
        ref_logp=None,
        kl_coef: float = 0.0,
        kl_estimator: str = "k3",
        entropy=None,
        entropy_coef: float = 0.0,
        **hparams,
    ):
        unknown = sorted(set(hparams) - set(defaults))
        if unknown:
            raise TypeError(f"{name}_loss() got unexpected keyword(s) {unknown}")
        hp = {**defaults, **hparams}
        check_tis(hp.get("tis_cap"), old_logp, who)
        b = prepare(
            logp,
            behaviour_logp,
            advantages,
            mask,
            prompt_index,
            num_prompts,
            aggregation,
            max_length,
            weights,
            old_logp=old_logp,
            ref_logp=ref_logp,
            entropy=entropy,
        )
        pg_tok, metrics = term(b, old_logp, **hp)
        return finish(
            b,
            pg_tok,
            metrics,
            ref_logp=ref_logp,
            kl_coef=kl_coef,
            kl_estimator=kl_estimator,
            entropy=entropy,
            entropy_coef=entropy_coef,
        )

    loss.__name__ = loss.__qualname__ = f"{name}_loss"
    loss.__module__, loss.__doc__ = term.__module__, term.__doc__
    loss.__signature__ = _shared_signature(term_params)  # type: ignore[attr-defined]
    return loss


def objective(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register `term` as objective `name` and return its full loss function."""

    def register(term: Callable[..., Any]) -> Callable[..., Any]:
        own = [
            p.name for p in inspect.signature(term).parameters.values() if p.kind is _P.KEYWORD_ONLY
        ]
        if name not in OBJECTIVE_HPARAMS or set(own) != set(OBJECTIVE_HPARAMS[name]):
            raise TypeError(
                f"objective {name!r}: its keywords {own} must be its row of "
                f"rl.hparams.OBJECTIVE_HPARAMS ({OBJECTIVE_HPARAMS.get(name)})"
            )
        LOSSES[name] = make_loss(name, term)
        return LOSSES[name]

    return register
