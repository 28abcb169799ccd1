"""Random weights for sampler tests, drawn with numpy and placed by the engine: much cheaper on
CPU than compiling the model's jitted initialiser (one compile per parameter shape)."""
import jax
import numpy as np


def random_params(engine, seed, head_seed=None):
    """Norm scales near 1, other weights small; with head_seed, the LM head alone is redrawn."""
    rng = np.random.default_rng(seed)
    head = np.random.default_rng(head_seed)

    def init(path, a):
        name = jax.tree_util.keystr(path)
        if head_seed is not None and "lm_head" in name:
            return head.normal(0, 0.05, a.shape).astype(a.dtype)
        near_one = "scale" in name
        return rng.normal(1.0 if near_one else 0.0, 0.1 if near_one else 0.05,
                          a.shape).astype(a.dtype)
    return engine.load_params(jax.tree.map_with_path(init, engine.abstract_params))
