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
        return rng.normal(1.0 if near_one else 0.0, 0.1 if near_one else 0.05, a.shape).astype(
            a.dtype
        )

    return engine.load_params(jax.tree.map_with_path(init, engine.abstract_params))


def engine_and_forward_logprobs(cfg, calls: int):
    """A continuation of prompt [5..9] sampled by an Engine on a 2 x 2 (data, tensor) mesh with
    4 decode steps per call, `calls` calls -> (sequence, the sampler's log-probs, the training
    forward's log-probs of the same tokens); the two must agree."""
    from jax.sharding import Mesh
    from scalerl_jax.config import SamplerConfig
    from scalerl_jax.models.transformer import forward_logits
    from scalerl_jax.sampler.engine import Engine

    mesh = Mesh(np.array(jax.devices()[4:8]).reshape(2, 2), ("data", "tensor"))
    engine = Engine(
        cfg,
        mesh,
        SamplerConfig(
            max_concurrent_decodes=2,
            max_prefill_length=8,
            max_target_length=32,
            max_new_tokens=20,
            interruptions=False,
            decode_steps_per_call=4,
        ),
    )
    params = random_params(engine, 0)
    prompt = [5, 6, 7, 8, 9]
    padded = np.zeros((8,), np.int32)
    padded[:5] = prompt
    state = engine.insert(engine.prefill(params, padded, 5), engine.init_decode_state(), 1)
    seq, lps = list(prompt), []
    for _ in range(calls):
        state, res = engine.generate(params, state)
        res = jax.device_get(res)
        seq += [int(t) for t in res.tokens[:, 1]]
        lps += [float(x) for x in res.logprobs[:, 1]]
    tokens = np.zeros((1, 32), np.int32)
    tokens[0, : len(seq)] = seq
    logits = jax.jit(forward_logits, static_argnums=0)(engine.graphdef, params, tokens)[0]
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    return seq, np.asarray(lps), logp[np.arange(4, len(seq) - 1), seq[5:]]
