"""RL math: the objectives (`objectives`, with `ppo_clip`, `loss_parts` and the `registry`),
aggregation, advantages (pure jit-safe array functions) and the no-positive-resampling
curriculum (host-side state). The public import is `scalerl_jax.losses`."""
