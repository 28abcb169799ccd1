"""RL math: objectives (losses), aggregation, advantages (pure jit-safe array functions) and the
no-positive-resampling curriculum (host-side state). The public import is `scalerl_jax.losses`."""
