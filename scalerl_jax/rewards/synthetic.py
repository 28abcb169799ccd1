"""Deprecated old name of `scalerl_jax.rewards.exact_match` (imports it and warns)."""

from scalerl_jax._renamed import alias

alias(__name__, "scalerl_jax.rewards.exact_match")
