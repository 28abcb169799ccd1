"""Deprecated old name of `scalerl_jax.scaling.synthetic_curves` (imports it and warns)."""

from scalerl_jax._renamed import alias

alias(__name__, "scalerl_jax.scaling.synthetic_curves")
