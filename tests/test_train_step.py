"""Train step, batch assembly and optimizer: sharded == unsharded, exact gradient accumulation,
the non-finite guard, a CISPO sanity run, and TrainBatch layout from Groups."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import LossConfig, MeshConfig, OptimConfig
from scalerl_jax.models import presets
from scalerl_jax.models.transformer import Transformer, forward_logits
from scalerl_jax.sampler.types import Completion, Group
from scalerl_jax.train import batch as batch_lib
from scalerl_jax.train import optim, state as state_lib
from scalerl_jax.train.step import make_train_step

CFG = presets.get("tiny-qwen2", num_layers=1)  # fp32 params and compute: tight comparisons
LOSS = LossConfig()  # ScaleRL: CISPO, prompt aggregation, batch norm, zero-variance filter
NUM_PROMPTS, G = 4, 4


def make_groups(seed=0, n=NUM_PROMPTS, g=G, vocab=256, zero_variance=()):
    """Random groups; completion lengths vary; one forced token in the middle of each."""
    rng = np.random.default_rng(seed)
    groups, rewards = [], []
    for i in range(n):
        comps = []
        for _ in range(g):
            length = int(rng.integers(3, 11))
            forced = np.zeros(length, bool)
            forced[length // 2] = True
            comps.append(
                Completion(
                    tokens=rng.integers(1, vocab, length).astype(np.int32),
                    logprobs=(-rng.random(length) * 4 - 0.1).astype(np.float32),
                    forced=forced,
                    versions=np.zeros(length, np.int32),
                    finish_reason="eos",
                )
            )
        prompt = rng.integers(1, vocab, int(rng.integers(2, 5))).astype(np.int32)
        groups.append(Group(prompt_id=f"p{i}", prompt_tokens=prompt, completions=comps))
        r = [1.0, -1.0] + [float(rng.choice([1.0, -1.0])) for _ in range(g - 2)]
        rewards.append([1.0] * g if i in zero_variance else r)
    return groups, rewards


def make_batch(micro_batches=1, seed=0, **kw):
    groups, rewards = make_groups(seed, **kw)
    batch, info = batch_lib.from_groups(
        groups,
        rewards,
        loss_cfg=LOSS,
        num_prompts=NUM_PROMPTS,
        micro_batches=micro_batches,
        row_multiple=4,
        seq_bucket=16,
    )
    return batch, info


def _mesh(n_devices, fsdp, tensor):
    return mesh_lib.trainer_mesh(MeshConfig(fsdp=fsdp, tensor=tensor), jax.devices()[:n_devices])


def _optim(micro_batches, logprob_chunk=8):
    return OptimConfig(
        learning_rate=1e-3, warmup_steps=0, micro_batches=micro_batches, logprob_chunk=logprob_chunk
    )


@functools.lru_cache(maxsize=None)
def _initial_state(n_devices, fsdp, tensor):
    # micro_batches does not change the optimizer state, so one initial state serves all.
    return state_lib.create_train_state(CFG, _optim(1), _mesh(n_devices, fsdp, tensor), seed=0)[2]


@functools.lru_cache(maxsize=None)
def setup(n_devices=1, fsdp=1, tensor=1, micro_batches=1, compute_dtype="float32", loss=LOSS):
    """(step_fn, fresh_state, graphdef) for one mesh; cached so each one compiles once."""
    mesh = _mesh(n_devices, fsdp, tensor)
    ocfg = _optim(micro_batches)
    cfg = CFG.replace(compute_dtype=compute_dtype)  # same params and optimizer state
    graphdef, abstract = state_lib.abstract_train_state(cfg, ocfg, mesh)
    step = make_train_step(
        graphdef,
        abstract,
        mesh,
        model_cfg=cfg,
        loss_cfg=loss,
        optim_cfg=ocfg,
        num_prompts=NUM_PROMPTS,
    )

    def fresh():  # a copy: the step donates its state
        return jax.tree.map(jnp.copy, _initial_state(n_devices, fsdp, tensor))

    return step, fresh, graphdef


def host(tree):
    return jax.tree.map(np.asarray, tree)


def adam_mu(state):
    """First moment after one update from zero: (1 - b1) * gradient."""
    return state.opt_state[1][0].mu


def assert_trees_close(a, b, rtol, atol):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        np.testing.assert_allclose(
            np.asarray(x), np.asarray(y), rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path)
        )


def test_sharded_step_equals_unsharded_and_state_is_sharded():
    batch, _ = make_batch()
    step1, fresh1, _ = setup()
    step8, fresh8, _ = setup(8, fsdp=4, tensor=2)
    s1, m1 = step1(fresh1(), batch)
    s8, m8 = step8(fresh8(), batch)

    q = s8.params["layers"][0]["attn"]["q"].get_value()  # [layers, D, H, hd]
    assert q.sharding.spec == PartitionSpec(None, "fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (
        CFG.num_layers,
        CFG.hidden_size // 4,
        CFG.num_heads // 2,
        CFG.dim_per_head,
    )
    mu = adam_mu(s8)["layers"][0]["mlp"]["gate"].get_value()
    assert mu.sharding.spec == PartitionSpec(None, "fsdp", "tensor")

    for key in ("loss", "grad_norm", "tokens", "normaliser", "ratio_mean", "entropy"):
        np.testing.assert_allclose(m8[key], m1[key], rtol=1e-5, err_msg=key)
    assert float(m1["tokens"]) > 0 and float(m1["grad_norm"]) > 0
    assert_trees_close(adam_mu(s8), adam_mu(s1), rtol=1e-4, atol=1e-9)  # the gradients
    assert_trees_close(s8.params, s1.params, rtol=0, atol=1e-6)
    assert int(s8.step) == int(s1.step) == 1


@pytest.mark.fast
def test_gradient_accumulation_equals_one_big_batch():
    big, info = make_batch(micro_batches=1)
    small, _ = make_batch(micro_batches=2)
    assert small.shape[0] == 2 and small.shape[1] * 2 == big.shape[1]
    # Micro-batches differ in token counts, so a per-micro-batch normaliser would be wrong.
    per_micro = small.loss_mask.sum(axis=(1, 2))
    assert per_micro[0] != per_micro[1]
    step1, fresh1, _ = setup()
    step2, fresh2, _ = setup(micro_batches=2)
    s1, m1 = step1(fresh1(), big)
    s2, m2 = step2(fresh2(), small)
    for key in (
        "loss",
        "grad_norm",
        "tokens",
        "prompts",
        "normaliser",
        "ratio_max",
        "kl_sampler_k3",
        "entropy",
    ):
        np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, err_msg=key)
    assert float(m1["prompts"]) == info["kept_groups"] == NUM_PROMPTS
    assert_trees_close(adam_mu(s2), adam_mu(s1), rtol=1e-4, atol=1e-9)
    assert_trees_close(s2.params, s1.params, rtol=0, atol=1e-6)


def test_non_finite_batch_is_skipped_and_counted():
    batch, _ = make_batch()
    step, fresh, _ = setup()
    state = fresh()
    before = host(state)
    bad_logp = batch.behaviour_logp.copy()
    m, r, t = np.argwhere(batch.loss_mask)[0]
    bad_logp[m, r, t] = np.nan  # a counted token: the loss becomes NaN
    state, metrics = step(state, batch.replace(behaviour_logp=bad_logp))
    assert float(metrics["skipped"]) == 1.0 and int(state.skipped) == 1
    assert int(state.step) == 1
    for x, y in zip(jax.tree.leaves(host(state.params)), jax.tree.leaves(before.params)):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(jax.tree.leaves(host(state.opt_state)), jax.tree.leaves(before.opt_state)):
        np.testing.assert_array_equal(x, y)

    bad_adv = batch.advantages.copy()
    bad_adv[m, r] = np.inf
    state, metrics = step(state, batch.replace(advantages=bad_adv))
    assert int(state.skipped) == 2 and float(metrics["skipped_total"]) == 2.0

    # No loss token (every group dropped): no update, but not a non-finite skip.
    empty = batch.replace(loss_mask=np.zeros_like(batch.loss_mask))
    state, metrics = step(state, empty)
    assert float(metrics["empty"]) == 1.0 and int(state.skipped) == 2 and int(state.step) == 3
    for x, y in zip(jax.tree.leaves(host(state.params)), jax.tree.leaves(before.params)):
        np.testing.assert_array_equal(x, y)

    # A good batch afterwards updates normally.
    state, metrics = step(state, batch)
    assert float(metrics["skipped"]) == 0.0 and float(metrics["update_norm"]) > 0


def _target_logp(graphdef, params, batch):
    """Full-softmax log-probs of the targets of micro-batch 0 (independent of the step's path)."""

    @jax.jit
    def f(params):
        logits = forward_logits(
            graphdef, params, batch.tokens[0], batch.positions[0], batch.segment_ids[0]
        )
        return jnp.take_along_axis(jax.nn.log_softmax(logits), batch.targets[0][..., None], -1)[
            ..., 0
        ]

    return np.asarray(f(params))


def test_cispo_steps_raise_logp_of_positive_advantage_tokens():
    """A few CISPO steps on one batch, in bf16 compute with the fp32 head (the production
    setting), move log-probs the way the advantages say.

    CISPO's loss VALUE is not a surrogate that must fall: its weights sg(min(rho, cap)) grow
    as the policy moves towards the positive tokens. What must fall is the advantage-weighted
    negative log-likelihood at fixed weights, -mean(A * logp) over counted tokens, checked here
    together with its two halves.
    """
    batch, _ = make_batch(seed=3)
    step, fresh, graphdef = setup(compute_dtype="bfloat16")
    _, fresh32, graphdef32 = setup()
    state = fresh()
    mask = batch.loss_mask[0]
    adv = np.broadcast_to(batch.advantages[0][:, None], mask.shape)
    pos, neg = mask & (adv > 0), mask & (adv < 0)
    lp0 = _target_logp(graphdef32, state.params, batch)  # fp32 forward to measure
    first = None
    for _ in range(4):
        state, metrics = step(state, batch)
        assert float(metrics["skipped"]) == 0.0
        first = first or metrics
    lp1 = _target_logp(graphdef32, state.params, batch)
    # The bf16 step's first loss agrees with the fp32 step's within bf16 rounding.
    _, m32 = setup()[0](fresh32(), batch)
    np.testing.assert_allclose(first["loss"], m32["loss"], rtol=2e-2)
    np.testing.assert_allclose(first["entropy"], m32["entropy"], rtol=1e-2)
    assert lp1[pos].mean() > lp0[pos].mean() + 0.05, (lp0[pos].mean(), lp1[pos].mean())
    assert lp1[neg].mean() < lp0[neg].mean() - 0.05, (lp0[neg].mean(), lp1[neg].mean())
    surrogate = lambda lp: -np.mean((adv * lp)[mask])  # noqa: E731
    assert surrogate(lp1) < surrogate(lp0) - 0.05


def test_tis_cap_in_the_step_updates_as_the_tis_objective():
    """The step has no separate pi_old: old_logp = sg(logp), so CISPO + tis_cap C has ratio 1
    and weights tokens by min(pi_theta / pi_sampler, C): the 'tis' objective with cap C."""
    batch, _ = make_batch(seed=4)
    # The random model's pi_theta / pi_sampler lies in ~[0.005, 0.25]: a cap of 0.05 binds.
    cap = 0.05
    step_c, fresh, _ = setup(loss=LossConfig(tis_cap=cap))
    step_t, _, _ = setup(loss=LossConfig(objective="tis", tis_cap=cap))
    step_p, _, _ = setup()
    s_c, m_c = step_c(fresh(), batch)
    s_t, m_t = step_t(fresh(), batch)
    _, m_p = step_p(fresh(), batch)
    assert 0 < float(m_c["tis_frac"]) < 1 and float(m_c["tis_frac"]) == float(m_t["tis_frac"])
    np.testing.assert_allclose(m_c["ratio_max"], 1.0, rtol=1e-6)  # against pi_old = pi_theta
    # Same terms summed in a different order: 1.0e-6 apart on an AVX-512 CPU.
    np.testing.assert_allclose(m_c["loss"], m_t["loss"], rtol=1e-5)
    assert abs(float(m_c["loss"]) - float(m_p["loss"])) > 1e-3 * abs(float(m_p["loss"]))
    assert_trees_close(adam_mu(s_c), adam_mu(s_t), rtol=1e-5, atol=1e-10)
    assert_trees_close(s_c.params, s_t.params, rtol=0, atol=1e-7)


def test_step_takes_logprob_chunk_from_optim_config_and_passes_only_what_the_objective_reads(
    monkeypatch,
):
    from scalerl_jax.rl import objectives as rl_losses
    from scalerl_jax.train import step as step_lib

    chunks, calls = [], []
    token_logprobs, policy_loss = step_lib.token_logprobs, rl_losses.policy_loss

    def record_chunk(*args, chunk_size, **kw):
        chunks.append(chunk_size)
        return token_logprobs(*args, chunk_size=chunk_size, **kw)

    def record_loss(objective, *args, **kw):
        calls.append((objective, {k for k in kw if k in rl_losses.HPARAM_NAMES}))
        return policy_loss(objective, *args, **kw)

    monkeypatch.setattr(step_lib, "token_logprobs", record_chunk)
    monkeypatch.setattr(rl_losses, "policy_loss", record_loss)
    mesh = _mesh(1, 1, 1)
    batch = step_lib.put_batch(make_batch()[0], mesh)
    configs = [
        (LossConfig(objective="cispo", ratio_cap=2.0, tis_cap=3.0), None),
        (LossConfig(objective="grpo", clip_eps_low=0.1, clip_eps_high=0.1), 8),
        (LossConfig(objective="dapo", clip_eps_high=0.28, dual_clip=3.0), 16),
        (LossConfig(objective="gspo", gspo_eps_low=1e-3), 8),
        (LossConfig(objective="tis", tis_cap=2.0), 8),
    ]
    for loss_cfg, chunk in configs:
        ocfg = _optim(1, logprob_chunk=chunk)
        graphdef, abstract = state_lib.abstract_train_state(CFG, ocfg, mesh)
        step = make_train_step(
            graphdef,
            abstract,
            mesh,
            model_cfg=CFG,
            loss_cfg=loss_cfg,
            optim_cfg=ocfg,
            num_prompts=NUM_PROMPTS,
        )
        step.jitted.lower(abstract, batch)  # traces: policy_loss would refuse an unread setting
        assert chunks[-1] == chunk
        objective, given = calls[-1]
        assert objective == loss_cfg.objective
        assert given == set(rl_losses.OBJECTIVE_HPARAMS[objective]) | {
            "aggregation",
            "entropy_coef",
        }
    with pytest.raises(TypeError, match="logprob_chunk"):  # one place for it: OptimConfig
        make_train_step(
            graphdef,
            abstract,
            mesh,
            model_cfg=CFG,
            loss_cfg=LOSS,
            optim_cfg=ocfg,
            num_prompts=NUM_PROMPTS,
            logprob_chunk=8,
        )


# -- batch assembly --------------------------------------------------------------------------


def test_from_groups_layout_masks_and_prompt_index():
    groups, rewards = make_groups(seed=1, zero_variance=(1,))
    batch, info = batch_lib.from_groups(
        groups,
        rewards,
        loss_cfg=LOSS,
        num_prompts=NUM_PROMPTS,
        micro_batches=1,
        row_multiple=4,
        seq_bucket=16,
    )
    assert info["dropped_groups"] == 1 and info["kept_groups"] == 3 and info["rows"] == 3 * G
    assert batch.shape[1] == NUM_PROMPTS * G and batch.shape[2] % 16 == 0
    pidx = batch.prompt_index[0]
    kept = [0, 2, 3]  # group 1 is all-correct: dropped, the others get dense indices 0..2
    assert list(pidx[: 3 * G]) == [d for d in range(3) for _ in range(G)]
    assert (pidx[3 * G :] == -1).all() and not batch.loss_mask[0, 3 * G :].any()
    for row in range(3 * G):
        g = groups[kept[pidx[row]]]
        c = g.completions[row % G]
        p, n = len(g.prompt_tokens), len(g.prompt_tokens) + len(c.tokens) - 1
        seq = np.concatenate([g.prompt_tokens, c.tokens])
        np.testing.assert_array_equal(batch.tokens[0, row, :n], seq[:-1])
        np.testing.assert_array_equal(batch.targets[0, row, :n], seq[1:])
        np.testing.assert_array_equal(batch.positions[0, row, :n], np.arange(n))
        assert (batch.segment_ids[0, row, :n] == 1).all()
        assert (batch.segment_ids[0, row, n:] == 0).all()
        # Completion tokens are targets of positions p-1 .. n-1; forced ones are masked out.
        np.testing.assert_array_equal(batch.loss_mask[0, row, p - 1 : n], ~c.forced)
        assert not batch.loss_mask[0, row, : p - 1].any() and not batch.loss_mask[0, row, n:].any()
        np.testing.assert_array_equal(batch.behaviour_logp[0, row, p - 1 : n], c.logprobs)
    assert info["forced_tokens"] == sum(c.forced.sum() for i in kept for c in groups[i].completions)
    assert info["loss_tokens"] == int(batch.loss_mask.sum())

    # Advantages: group-centred +-1 rewards over the std of the kept rows' centred values.
    r = np.array([rewards[i] for i in kept])
    centred = r - r.mean(axis=1, keepdims=True)
    expected = centred / (centred.reshape(-1).std(ddof=1) + 1e-6)
    np.testing.assert_allclose(batch.advantages[0, : 3 * G], expected.reshape(-1), rtol=1e-5)


def test_from_groups_zero_variance_options_and_length_penalty():
    groups, rewards = make_groups(seed=2, zero_variance=(0,))
    kept_all, info = batch_lib.from_groups(
        groups,
        rewards,
        loss_cfg=LossConfig(zero_variance_filter=False),
        num_prompts=NUM_PROMPTS,
        row_multiple=4,
        seq_bucket=16,
    )
    assert info["kept_groups"] == NUM_PROMPTS and info["zero_variance_groups"] == 1
    zero_rows = kept_all.prompt_index[0] == 0
    assert (kept_all.advantages[0][zero_rows] == 0).all() and kept_all.loss_mask[0][zero_rows].any()
    # ScaleRL's length penalty on correct answers breaks the tie of an all-correct group.
    lengths = [len(c.tokens) for c in groups[0].completions]
    assert len(set(lengths)) > 1
    penalised, info = batch_lib.from_groups(
        groups,
        rewards,
        loss_cfg=LossConfig(length_penalty=True, length_penalty_max=8, length_penalty_cache=4),
        num_prompts=NUM_PROMPTS,
        row_multiple=4,
        seq_bucket=16,
    )
    assert info["zero_variance_groups"] == 0 and info["kept_groups"] == NUM_PROMPTS
    adv0 = penalised.advantages[0][penalised.prompt_index[0] == 0]
    longest, shortest = int(np.argmax(lengths)), int(np.argmin(lengths))
    assert adv0[longest] < adv0[shortest]


def test_from_groups_keeps_prompts_whole_per_micro_batch_and_checks_layout():
    batch, _ = make_batch(micro_batches=2)
    for p in range(NUM_PROMPTS):
        micro = {m for m, _ in np.argwhere(batch.prompt_index == p)}
        assert len(micro) == 1
    split = batch.prompt_index.copy()
    split[1, 0] = split[0, 0]
    with pytest.raises(ValueError, match="must share one micro-batch"):
        batch_lib.check_layout(batch.replace(prompt_index=split))
    groups, rewards = make_groups()
    with pytest.raises(ValueError, match="2 reward lists"):
        batch_lib.from_groups(groups, rewards[:2], loss_cfg=LOSS, num_prompts=NUM_PROMPTS)
    with pytest.raises(ValueError, match="does not fit"):
        batch_lib.from_groups(
            groups, rewards, loss_cfg=LOSS, num_prompts=NUM_PROMPTS, rows_per_micro=6
        )


def test_step_rejects_mismatched_batch():
    batch, _ = make_batch(micro_batches=2)
    step, fresh, _ = setup()
    with pytest.raises(ValueError, match="OptimConfig.micro_batches=1"):
        step(None, batch)


# -- optimizer -------------------------------------------------------------------------------


def test_schedule_warmup_constant_and_cosine():
    const = optim.learning_rate(OptimConfig(learning_rate=5e-7, warmup_steps=100))
    np.testing.assert_allclose(
        [float(const(c)) for c in (0, 49, 99, 100, 10_000)],
        [5e-9, 2.5e-7, 5e-7, 5e-7, 5e-7],
        rtol=1e-6,
    )
    cos = optim.learning_rate(
        OptimConfig(learning_rate=1.0, warmup_steps=10, schedule="cosine", total_steps=110)
    )
    np.testing.assert_allclose(
        [float(cos(c)) for c in (4, 10, 60, 110, 200)], [0.5, 1.0, 0.5, 0.0, 0.0], atol=1e-6
    )


def test_weight_decay_mask_covers_matrices_only():
    cfg = presets.get("tiny-qwen2")  # has q/k/v biases ([heads, head_dim]: 2-D but not decayed)
    _, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0))))
    mask = optim.decay_mask(params)
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
    decayed = {k for k, v in flat.items() if v}
    assert any("['embed']" in k for k in decayed)
    for name in ("'q'", "'k'", "'v'", "'o'", "'gate'", "'up'", "'down'"):
        assert any(f"[{name}]" in k for k in decayed), name
    for k in flat:
        if "bias" in k or "norm" in k:
            assert k not in decayed, k
