"""Engine: exactness against the training forward, forced tokens, weight swaps, sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from _sampler_params import random_params
from scalerl_jax.config import SamplerConfig
from scalerl_jax.models import presets, transformer
from scalerl_jax.sampler import sampling
from scalerl_jax.sampler.engine import Engine, EngineError, count_compilations

CFG = presets.get("tiny-qwen3")  # untied head: a head-only weight swap leaves the KV cache exact
REF_LEN = 64  # reference forward padded to one length: one compile, causality keeps it exact


def sampler_cfg(**kw):
    base = dict(
        max_concurrent_decodes=4,
        max_prefill_length=16,
        max_target_length=REF_LEN,
        max_new_tokens=48,
        interruptions=False,
        temperature=1.0,
    )
    base.update(kw)
    return SamplerConfig(**base)


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[4:8]).reshape(2, 2), ("data", "tensor"))


@pytest.fixture(scope="module")
def engine(mesh):
    return Engine(CFG, mesh, sampler_cfg())


@pytest.fixture(scope="module")
def params(engine):
    return random_params(engine, 1)


@pytest.fixture(scope="module")
def greedy(mesh):
    """A greedy engine and the jitted full forward its continuations are checked against,
    compiled once for the tests that share them."""
    eng = Engine(CFG, mesh, sampler_cfg(temperature=0.0, decode_steps_per_call=3))
    return eng, jax.jit(lambda p, t: transformer.forward_logits(eng.graphdef, p, t))


@pytest.fixture(scope="module")
def ref_logprobs(engine):
    fn = jax.jit(
        lambda p, t: jax.nn.log_softmax(
            transformer.forward_logits(engine.graphdef, p, t)[0], axis=-1
        )
    )

    def ref(p, seq):
        """[len(seq)-1] log-probs of seq[1:] under the full training forward of params p."""
        padded = np.zeros((1, REF_LEN), np.int32)
        padded[0, : len(seq)] = seq
        lp = np.asarray(fn(p, jnp.asarray(padded)))
        return lp[np.arange(len(seq) - 1), np.asarray(seq[1:])]

    return ref


def prefill(engine, params, prompt):
    padded = np.zeros((engine.max_prefill_length,), np.int32)
    padded[: len(prompt)] = prompt
    return engine.prefill(params, padded, len(prompt))


def run(engine, params, state, slots, steps, seqs, lps, forced=None):
    for _ in range(steps):
        state, res = engine.generate(params, state)
        res = jax.device_get(res)
        for k in range(res.tokens.shape[0]):
            for s in slots:
                assert res.valid[k, s]
                seqs[s].append(int(res.tokens[k, s]))
                lps[s].append(float(res.logprobs[k, s]))
                if forced is not None:
                    forced[s].append(bool(res.forced[k, s]))
    return state


@pytest.mark.fast
def test_greedy_equals_argmax_of_full_forward(greedy, params):
    eng, fwd = greedy
    prompts = {0: [3, 1, 4, 1, 5, 9, 2, 6], 3: [27, 18, 28]}  # two slots, different lengths
    state = eng.init_decode_state()
    for slot, prompt in prompts.items():
        state = eng.insert(prefill(eng, params, prompt), state, slot)
    seqs = {s: list(p) for s, p in prompts.items()}
    run(eng, params, state, list(prompts), 4, seqs, {s: [] for s in prompts})
    for slot, prompt in prompts.items():
        seq = seqs[slot]
        assert len(seq) == len(prompt) + 12
        logits = np.asarray(fwd(params, jnp.asarray([seq])))[0]
        np.testing.assert_array_equal(seq[len(prompt) :], logits[len(prompt) - 1 : -1].argmax(-1))


def test_batched_prefill_rows_go_to_their_slots(greedy, params):
    # Three prompts of different lengths in one prefill_batch (plus a padding row), inserted out
    # of order: each slot's cache equals its prompt's own prefill and its greedy continuation
    # is the argmax of the full forward.
    eng, fwd = greedy
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [27, 18, 28], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]]
    padded = np.zeros((4, eng.max_prefill_length), np.int32)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = p
    prefix = eng.prefill_batch(params, padded, [len(p) for p in prompts] + [1])
    assert prefix.cache.k[0].shape[0] == 4 and prefix.length.shape == (4,)
    for i, p in enumerate(prompts):
        one, n = prefill(eng, params, p), len(p) - 1
        assert int(prefix.length[i]) == n and int(prefix.last_token[i]) == p[-1]
        np.testing.assert_allclose(
            np.asarray(prefix.cache.k[0][i, ..., :n]),
            np.asarray(one.cache.k[0][0, ..., :n]),
            atol=1e-5,
            rtol=0,
        )
        np.testing.assert_allclose(
            np.asarray(prefix.cache.v[-1][i, :, :n]),
            np.asarray(one.cache.v[-1][0, :, :n]),
            atol=1e-5,
            rtol=0,
        )
    slots, rows = [2, 0, 3], [1, 0, 2]
    state = eng.bulk_insert(prefix, eng.init_decode_state(), slots, rows=rows)
    seqs = {s: list(prompts[r]) for s, r in zip(slots, rows)}
    run(eng, params, state, slots, 4, seqs, {s: [] for s in slots})
    for s, r in zip(slots, rows):
        n = len(prompts[r])
        logits = np.asarray(fwd(params, jnp.asarray([seqs[s]])))[0]
        np.testing.assert_array_equal(seqs[s][n:], logits[n - 1 : -1].argmax(-1))


def test_a_slot_reused_without_keys_draws_afresh(engine, params):
    # Draws are per (key, position): a second sample in the same slot, inserted without keys,
    # gets a new key (else it would repeat the first sample's draws position by position).
    prompt = [11, 12, 13, 14, 15]
    state, out = engine.init_decode_state(), []
    for _ in range(2):
        state = engine.insert(prefill(engine, params, prompt), state, 0)
        seqs = {0: []}
        state = run(engine, params, state, [0], 12, seqs, {0: []})
        out.append(seqs[0])
        state = engine.free_resource(state, 0)
    assert out[0] != out[1]


def test_logprobs_equal_training_forward_and_slots_sample_independently(
    engine, params, ref_logprobs
):
    prompt = [11, 12, 13, 14, 15]
    state = engine.bulk_insert(
        prefill(engine, params, prompt), engine.init_decode_state(), [0, 1, 3]
    )  # one prefill, three samples of the group
    seqs = {s: list(prompt) for s in (0, 1, 3)}
    lps = {s: [] for s in (0, 1, 3)}
    run(engine, params, state, [0, 1, 3], 20, seqs, lps)
    for s in (0, 1, 3):
        ref = ref_logprobs(params, seqs[s])[len(prompt) - 1 :]
        np.testing.assert_allclose(lps[s], ref, atol=1e-5, rtol=0)
    assert len({tuple(seqs[s][len(prompt) :]) for s in (0, 1, 3)}) == 3


def test_forced_tokens_and_rewind_keep_the_cache_exact(engine, params, ref_logprobs):
    prompt = [40, 41, 42]
    state = engine.insert(prefill(engine, params, prompt), engine.init_decode_state(), 2)
    seqs, lps, forced = {2: list(prompt)}, {2: []}, {2: []}
    state = run(engine, params, state, [2], 4, seqs, lps, forced)
    # Rewind past the last two samples (as the driver does after a multi-step call overshot),
    # then force a phrase: it must come out verbatim, flagged, and the cache must stay exact.
    del seqs[2][-2:], lps[2][-2:], forced[2][-2:]
    state = engine.rewind(state, 2, len(seqs[2]) - 1, seqs[2][-1])
    phrase = [200, 201, 202, 203]
    state = engine.force_tokens(state, 2, phrase)
    state = run(engine, params, state, [2], 8, seqs, lps, forced)
    gen = seqs[2][len(prompt) :]
    assert gen[2:6] == phrase
    assert forced[2] == [False] * 2 + [True] * 4 + [False] * 4
    ref = ref_logprobs(params, seqs[2])[len(prompt) - 1 :]
    mask = ~np.asarray(forced[2])
    np.testing.assert_allclose(np.asarray(lps[2])[mask], ref[mask], atol=1e-5, rtol=0)
    # forced tokens report the (full-support, temperature 1) policy log-prob of the phrase
    np.testing.assert_allclose(np.asarray(lps[2])[~mask], ref[~mask], atol=1e-5, rtol=0)


def test_weight_swap_mid_generation_uses_new_params_without_recompiling(
    engine, params, ref_logprobs
):
    # New params differ in the LM head and final norm only: the KV cache written under the old
    # params is then also the new params' cache, so later tokens must match the new params' full
    # forward exactly (in general PipelineRL keeps the stale cache on purpose).
    key = jax.random.PRNGKey(7)
    new = jax.tree.map(lambda x: x, params)
    new["lm_head"].set_value(0.05 * jax.random.normal(key, params["lm_head"].get_value().shape))
    new["final_norm"]["scale"].set_value(params["final_norm"]["scale"].get_value() * 1.5)
    new = engine.load_params(new)
    prompt = [7, 8, 9, 10]
    state = engine.insert(prefill(engine, params, prompt), engine.init_decode_state(), 1)
    seqs, lps = {1: list(prompt)}, {1: []}
    state = run(engine, params, state, [1], 1, seqs, lps)  # compiled before: a warm sampler
    with count_compilations() as compiles:
        state = run(engine, params, state, [1], 5, seqs, lps)
        n_old = len(lps[1])
        state = run(engine, engine.load_params(new), state, [1], 6, seqs, lps)
    assert compiles == [] and engine.traces["generate"] == 1
    p = len(prompt)
    old_ref, new_ref = ref_logprobs(params, seqs[1])[p - 1 :], ref_logprobs(new, seqs[1])[p - 1 :]
    got = np.asarray(lps[1])
    np.testing.assert_allclose(got[:n_old], old_ref[:n_old], atol=1e-5, rtol=0)
    np.testing.assert_allclose(got[n_old:], new_ref[n_old:], atol=1e-5, rtol=0)
    assert np.abs(new_ref[n_old:] - old_ref[n_old:]).max() > 0.1  # the swap changed something


def test_state_is_sharded_over_the_sampler_mesh(engine):
    state = engine.init_decode_state()
    for kv in (state.cache.k, state.cache.v):  # stacked over the layers (not split)
        assert kv.sharding.spec == PartitionSpec(None, "data", "tensor", None, None)
    assert state.lengths.sharding.spec == PartitionSpec("data")
    # Keys [B, KV, hd, S], values [B, KV, S, hd]: the layouts the decode dots read as stored.
    assert state.cache.k[0].shape == (4, CFG.num_kv_heads, CFG.dim_per_head, REF_LEN)
    assert state.cache.v[0].shape == (4, CFG.num_kv_heads, REF_LEN, CFG.dim_per_head)


def test_engine_rejects_bad_input(engine, params):
    with pytest.raises(EngineError, match="padded length 17 > max_prefill_length=16"):
        engine.prefill(params, np.zeros(17, np.int32), 3)
    with pytest.raises(EngineError, match=r"true_length=0 must be in \[1, 16\]"):
        engine.prefill(params, np.zeros(16, np.int32), 0)
    with pytest.raises(EngineError, match=r"slots=\[1, 1\]"):
        engine.bulk_insert(None, None, [1, 1])
    with pytest.raises(EngineError, match=r"padded_tokens must be \[N, T\], got shape \(16,\)"):
        engine.prefill_batch(params, np.zeros(16, np.int32), [3])
    with pytest.raises(EngineError, match="prefill_batch: 1 true_lengths for 2 rows"):
        engine.prefill_batch(params, np.zeros((2, 16), np.int32), [3])
    with pytest.raises(EngineError, match=r"true_length=17 must be in \[1, 16\]"):
        engine.prefill_batch(params, np.zeros((2, 16), np.int32), [3, 17])
    prefix = engine.prefill_batch(params, np.ones((2, 16), np.int32), [3, 4])
    with pytest.raises(EngineError, match=r"rows=\[0, 2\] must give one row in \[0, 2\)"):
        engine.bulk_insert(prefix, engine.init_decode_state(), [0, 1], rows=[0, 2])
    with pytest.raises(EngineError, match="max_forced_tokens=64"):
        engine.force_tokens(None, 0, np.zeros(65, np.int32))
    bad = jax.tree.map(lambda x: x, params)
    bad["embed"].set_value(jnp.zeros((3, 3)))
    with pytest.raises(EngineError, match=r"param .*embed.* float32\[3, 3\]"):
        engine.load_params(bad)


def test_top_k_top_p_support_and_renormalised_logprobs():
    n = 2000
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * n, jnp.float32))
    keys = jax.random.split(jax.random.PRNGKey(0), n)

    def draw(**kw):
        tok, lp = jax.jit(lambda lg, k: sampling.sample(lg, k, **kw))(logits, keys)
        return np.asarray(tok), np.asarray(lp)

    tok, lp = draw(temperature=1.0, top_k=2)
    assert set(np.unique(tok)) == {0, 1}
    np.testing.assert_allclose(lp, np.log(np.array([0.5, 0.3]) / 0.8)[tok], atol=1e-6)
    # nucleus 0.9: 0.5 + 0.3 < 0.9, so the third token (0.15) is still needed; the fourth is not
    tok, lp = draw(temperature=1.0, top_p=0.9)
    assert set(np.unique(tok)) == {0, 1, 2}
    np.testing.assert_allclose(lp, np.log(np.array([0.5, 0.3, 0.15]) / 0.95)[tok], atol=1e-6)
    freq = np.bincount(tok, minlength=4) / len(tok)
    np.testing.assert_allclose(freq[:3], np.array([0.5, 0.3, 0.15]) / 0.95, atol=0.04)
    # top-k then top-p over the renormalised top-k distribution: 0.5/0.8 < 0.6 needs token 1 too
    tok, lp = draw(temperature=1.0, top_k=3, top_p=0.6)
    assert set(np.unique(tok)) == {0, 1}
    np.testing.assert_allclose(lp, np.log(np.array([0.5, 0.3]) / 0.8)[tok], atol=1e-6)
    # temperature 2 flattens: log-prob is that of softmax(logits / 2)
    tok, lp = draw(temperature=2.0)
    np.testing.assert_allclose(lp, np.asarray(jax.nn.log_softmax(logits[0] / 2))[tok], atol=1e-6)
    # greedy reports the untempered model log-prob; forced tokens the full-support one
    tok, lp = draw(temperature=0.0)
    assert (tok == 0).all() and np.allclose(lp, np.log(0.5))
    flp = sampling.token_logprob(logits[:2], jnp.array([3, 2]), temperature=1.0)
    np.testing.assert_allclose(flp, np.log([0.05, 0.15]), atol=1e-6)


@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_windowed_generate_equals_full_cache_generate(mesh, engine, params, steps_per_call):
    # Attending over only the filled window must give the same tokens, log-probs and cache
    # contents as attending over the whole (masked) cache; slot 3 stays inactive throughout.
    # One step per call reads the window in place; four cut it out once per call.
    k = steps_per_call
    eng = engine if k == 1 else Engine(CFG, mesh, sampler_cfg(decode_steps_per_call=k))
    assert eng.cache_windows == [16, 32, 48, 64]
    prompts = {0: [5, 6, 7], 1: [9, 10, 11, 12, 13, 14, 15, 16, 17], 2: [4] * 12}
    states = []
    for _ in range(2):
        state = eng.init_decode_state()
        for slot, p in prompts.items():
            state = eng.bulk_insert(
                prefill(eng, params, p), state, [slot], keys=np.array([[slot, 1]], np.uint32)
            )
        states.append(state)
    full, windowed = states
    lengths = {s: len(p) - 1 for s, p in prompts.items()}
    used = set()
    for _ in range(32 // k):  # lengths 11 .. 43: windows 16, 32 and 48 all run
        filled = max(lengths.values())
        used.add(next(w for w in eng.cache_windows if w >= filled + k))
        full, r_full = eng.generate(params, full)
        windowed, r_win = eng.generate(params, windowed, max_length=filled)
        r_full, r_win = jax.device_get((r_full, r_win))
        np.testing.assert_array_equal(r_win.tokens, r_full.tokens)
        np.testing.assert_allclose(r_win.logprobs, r_full.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(r_win.valid, r_full.valid)
        lengths = {s: n + k for s, n in lengths.items()}
    assert used == {16, 32, 48}
    np.testing.assert_array_equal(np.asarray(windowed.lengths), np.asarray(full.lengths))
    for kw, kf, vw, vf in zip(windowed.cache.k, full.cache.k, windowed.cache.v, full.cache.v):
        for s, n in lengths.items():  # the filled part of every live slot is the same
            np.testing.assert_allclose(
                np.asarray(kw)[s, :, :, :n], np.asarray(kf)[s, :, :, :n], atol=1e-5
            )
            np.testing.assert_allclose(
                np.asarray(vw)[s, :, :n], np.asarray(vf)[s, :, :n], atol=1e-5
            )


def test_cache_is_replicated_over_tensor_when_kv_heads_do_not_divide():
    # tiny-qwen3 has 2 KV heads: over tensor=4 the cache cannot split its heads, so it keeps
    # them whole instead of failing to build the decode state.
    mesh4 = Mesh(np.array(jax.devices()[4:8]).reshape(1, 4), ("data", "tensor"))
    state = Engine(CFG, mesh4, sampler_cfg()).init_decode_state()
    for kv in (state.cache.k, state.cache.v):
        assert tuple(kv.sharding.spec)[2:] in ((), (None, None, None))
    assert state.cache.k[0].shape == (4, CFG.num_kv_heads, CFG.dim_per_head, REF_LEN)
