"""Driver: continuous batching, groups, interruptions, in-flight weight updates, errors."""

import dataclasses
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from _sampler_params import random_params
from scalerl_jax.config import ConfigError, SamplerConfig
from scalerl_jax.models import presets, transformer
from scalerl_jax.sampler import (
    Driver,
    DriverError,
    Engine,
    Prompt,
    PromptTooLongError,
    count_compilations,
)

CFG = presets.get("tiny-qwen3")
S = 96  # KV-cache length
EOS = list(range(100, 148))  # 48 of 256 tokens: a random model stops after ~5 tokens on average
PHRASE = [240, 241, 242]
CLOSE = [250, 251]
SCFG = SamplerConfig(
    max_concurrent_decodes=4,
    max_prefill_length=32,
    max_target_length=S,
    max_new_tokens=40,
    temperature=1.0,
    decode_steps_per_call=4,
    interruptions=True,
    think_min=6,
    think_max=6,
    answer_budget=6,
)


@pytest.fixture(scope="module")
def engine():
    mesh = Mesh(np.array(jax.devices()[4:8]).reshape(2, 2), ("data", "tensor"))
    return Engine(CFG, mesh, SCFG)


@pytest.fixture(scope="module")
def engine1(engine):
    """The same engine with one decode step per call (the SamplerConfig default)."""
    return Engine(CFG, engine.mesh, dataclasses.replace(SCFG, decode_steps_per_call=1))


@pytest.fixture(scope="module")
def params(engine):
    return random_params(engine, 1)


@pytest.fixture(scope="module")
def reference(engine):
    fn = jax.jit(
        lambda p, t: jax.nn.log_softmax(transformer.forward_logits(engine.graphdef, p, t), axis=-1)
    )

    def ref(p, groups):
        """Per completion, the full-forward log-probs of its tokens under params p."""
        rows = [(g.prompt_tokens, c) for g in groups for c in g.completions]
        seqs = np.zeros((len(rows), S), np.int32)
        for i, (prompt, c) in enumerate(rows):
            seqs[i, : len(prompt) + len(c.tokens)] = np.concatenate([prompt, c.tokens])
        lp = np.asarray(fn(p, jnp.asarray(seqs)))
        return [
            lp[i, np.arange(len(prompt) - 1, len(prompt) - 1 + len(c.tokens)), c.tokens]
            for i, (prompt, c) in enumerate(rows)
        ]

    return ref


def prompts(n, lengths=(5, 9, 3, 20, 31, 12), seed=0):
    rng = np.random.default_rng(seed)
    return [
        Prompt(f"p{i}", rng.integers(150, 240, lengths[i % len(lengths)]).tolist(), {"answer": i})
        for i in range(n)
    ]


def collect(engine, params, ps, **kw):
    """Run a driver to the end in this thread; (groups, driver)."""
    out = []
    driver = Driver(engine, params, ps, on_group=out.append, **kw)
    driver.run()
    return out, driver


@pytest.mark.parametrize("steps_per_call,ahead", [(4, True), (4, False), (1, True)])
def test_interruption_forces_the_phrase_at_the_budget_and_the_answer_follows(
    engine, engine1, params, reference, steps_per_call, ahead
):
    # The budget falls inside a 4-step call, or (dispatch ahead) after a call already in
    # flight: either way the slot is rewound to the budget before the phrase.
    eng = engine if steps_per_call == 4 else engine1
    groups, _ = collect(
        eng,
        params,
        prompts(3),
        group_size=16,
        eos_ids=EOS,
        think_close_ids=CLOSE,
        phrase_ids=PHRASE,
        seed=3,
        dispatch_ahead=ahead,
    )
    comps = [c for g in groups for c in g.completions]
    assert len(comps) == 48
    b, answer = SCFG.think_min, SCFG.answer_budget
    for c in comps:
        toks = c.tokens.tolist()
        sampled_eos = [i for i, t in enumerate(toks) if t in EOS and not c.forced[i]]
        if sampled_eos and sampled_eos[0] < b:  # ended while thinking
            assert (c.finish_reason, c.interrupted, len(toks)) == ("eos", False, sampled_eos[0] + 1)
            assert not c.forced.any()
            continue
        assert c.interrupted
        assert toks[b : b + 3] == PHRASE
        want_forced = [False] * b + [True] * 3 + [False] * (len(toks) - b - 3)
        np.testing.assert_array_equal(c.forced, want_forced)
        after = toks[b + 3 :]
        assert len(after) <= answer
        if c.finish_reason == "interrupted":
            assert after and after[-1] in EOS and not set(after[:-1]) & set(EOS)
        else:
            assert c.finish_reason == "truncated" and len(after) == answer
    reasons = {c.finish_reason for c in comps}
    assert reasons == {"eos", "interrupted", "truncated"}
    # the KV cache saw exactly the recorded tokens (the slot was rewound before the phrase): the
    # answer's log-probs are the full forward's
    for c, ref in zip(comps, reference(params, groups)):
        np.testing.assert_allclose(c.logprobs, ref, atol=1e-5, rtol=0)


def test_samples_do_not_depend_on_dispatch_ahead_or_steps_per_call(engine, engine1, params):
    # Queueing each call before the previous one is read, or decoding 4 steps per call, makes
    # slots run past ends and thinking budgets; the extra steps are dropped and interrupted
    # slots rewound. Each draw depends only on the sample's key and the position, so every
    # mode gives the same samples, interrupted ones included (EOS endings, refills, G > slots).
    runs = {
        (k, ahead): collect(
            engine if k == 4 else engine1,
            params,
            prompts(3),
            group_size=16,
            eos_ids=EOS,
            think_close_ids=CLOSE,
            phrase_ids=PHRASE,
            seed=3,
            dispatch_ahead=ahead,
        )
        for k in (4, 1)
        for ahead in (False, True)
    }
    base, base_driver = runs[4, False]
    comps = [c for g in base for c in g.completions]
    assert {c.finish_reason for c in comps} == {"eos", "interrupted", "truncated"}
    assert len({len(c.tokens) for c in comps}) > 5
    for groups, driver in runs.values():
        by_id = {g.prompt_id: g for g in groups}
        assert sorted(by_id) == sorted(g.prompt_id for g in base)
        for g in base:
            for c, d in zip(g.completions, by_id[g.prompt_id].completions):
                np.testing.assert_array_equal(d.tokens, c.tokens)
                np.testing.assert_array_equal(d.forced, c.forced)
                np.testing.assert_allclose(d.logprobs, c.logprobs, atol=1e-5, rtol=0)
                assert (d.finish_reason, d.interrupted) == (c.finish_reason, c.interrupted)
        assert driver.stats["tokens"] == base_driver.stats["tokens"]


def test_a_batched_first_fill_samples_what_one_prompt_at_a_time_samples(engine1, params, reference):
    # All 4 slots free: the prompts of one length bucket are prefilled in one batched pass. A
    # stream that offers one prompt per step (None between them: "nothing now") prefills one
    # at a time; each sample depends only on (seed, ticket, index) and the params, so both runs
    # give the same completions, and the batched one equals the full forward.
    cfg = dataclasses.replace(engine1.cfg, interruptions=False, max_new_tokens=20)
    ps = prompts(9)

    def trickle():
        for p in ps:
            yield p
            yield None

    off = dataclasses.replace(cfg, prefill_batch_tokens=0)  # batching off: one per pass
    runs = [
        collect(engine1, params, stream, group_size=1, eos_ids=EOS, cfg=c, seed=3)
        for stream, c in ((ps, cfg), (trickle(), cfg), (ps, off))
    ]
    (batched, bd), singles = runs[0], runs[1:]
    assert bd.stats["prefills"] == 9 and bd.stats["prefill_calls"] < 9
    for single, sd in singles:
        assert sd.stats["prefills"] == sd.stats["prefill_calls"] == 9
        by_id = {g.prompt_id: g for g in single}
        assert sorted(by_id) == sorted(g.prompt_id for g in batched)
        for g in batched:
            for c, d in zip(g.completions, by_id[g.prompt_id].completions):
                np.testing.assert_array_equal(c.tokens, d.tokens)
                np.testing.assert_allclose(c.logprobs, d.logprobs, atol=1e-5, rtol=0)
    for got, ref in zip(
        (c.logprobs for g in batched for c in g.completions), reference(params, batched)
    ):
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)


@pytest.mark.fast
def test_prefill_batch_tokens_must_not_be_negative():
    with pytest.raises(ConfigError, match=r"SamplerConfig.prefill_batch_tokens=-1: must be >= 0"):
        SamplerConfig(prefill_batch_tokens=-1)


def test_budgets_are_drawn_per_sample_within_range(engine, params):
    cfg = dataclasses.replace(SCFG, think_min=4, think_max=9, answer_budget=2)
    groups, _ = collect(
        engine,
        params,
        prompts(2),
        group_size=8,
        eos_ids=[],
        think_close_ids=CLOSE,
        phrase_ids=PHRASE,
        cfg=cfg,
        seed=5,
    )
    starts = []
    for c in (c for g in groups for c in g.completions):
        start = int(np.argmax(c.forced))
        assert c.interrupted and c.finish_reason == "truncated"
        assert c.tokens[start : start + 3].tolist() == PHRASE and c.forced.sum() == 3
        assert len(c.tokens) == start + 3 + 2
        starts.append(start)
    assert min(starts) >= 4 and max(starts) <= 9 and len(set(starts)) >= 3


def test_groups_with_more_samples_than_slots_and_uneven_lengths(engine, params, reference):
    cfg = dataclasses.replace(SCFG, interruptions=False, max_new_tokens=24)
    ps = prompts(7)
    groups, driver = collect(engine, params, ps, group_size=6, eos_ids=EOS, cfg=cfg, seed=1)
    assert sorted(g.prompt_id for g in groups) == [p.prompt_id for p in ps]
    by_id = {p.prompt_id: p for p in ps}
    for g in groups:
        assert g.prompt_tokens.tolist() == by_id[g.prompt_id].tokens
        assert g.metadata == by_id[g.prompt_id].metadata and not g.prompt_truncated
        assert len(g.completions) == 6 and g.min_version == 0
        for c in g.completions:
            ends_eos = c.tokens[-1] in EOS and not set(c.tokens[:-1].tolist()) & set(EOS)
            assert (c.finish_reason == "eos") == ends_eos
            assert c.finish_reason == "eos" or len(c.tokens) == 24
    lengths = [len(c.tokens) for g in groups for c in g.completions]
    assert len(set(lengths)) > 5  # uneven
    for got, ref in zip(
        (c.logprobs for g in groups for c in g.completions), reference(params, groups)
    ):
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    st = driver.stats
    assert st["prefills"] == 7 and st["completions"] == 42 and st["tokens"] == sum(lengths)
    assert 0 < driver.utilisation <= 1


def test_weight_update_between_steps_tags_versions_without_recompiling(engine, params, reference):
    # Only the LM head changes, so the KV cache is the same under both versions and every
    # token's log-prob must equal the full forward of the params version it is tagged with.
    new = random_params(engine, 1, head_seed=9)
    cfg = dataclasses.replace(SCFG, interruptions=False, max_new_tokens=30)
    out = []
    driver = Driver(
        engine,
        params,
        prompts(6, lengths=(10, 14)),
        group_size=3,
        eos_ids=EOS[:8],
        cfg=cfg,
        on_group=out.append,
    )
    driver.precompile()  # every program compiled before the window, so any compile is the swap's
    for _ in range(3):
        driver.step()
    with count_compilations() as compiles:
        driver.update_params(new, version=1)
        driver.run()
    assert compiles == [] and driver.stats["weight_updates"] == 1
    comps = [c for g in out for c in g.completions]
    assert all((np.diff(c.versions) >= 0).all() for c in comps)
    assert any(c.versions[0] == 0 and c.versions[-1] == 1 for c in comps)  # mid-sequence swap
    ref = {0: reference(params, out), 1: reference(new, out)}
    for i, c in enumerate(comps):
        want = np.where(c.versions == 0, ref[0][i], ref[1][i])
        np.testing.assert_allclose(c.logprobs, want, atol=1e-5, rtol=0)


def test_precompile_leaves_nothing_to_compile_in_the_run(engine, params):
    # A fresh engine (its own jitted functions): precompile builds one generate program per
    # cache window and prefill / insert programs per prompt bucket; the run after it compiles
    # nothing.
    fresh = Engine(CFG, engine.mesh, SCFG)
    cfg = dataclasses.replace(SCFG, interruptions=False, max_new_tokens=30)
    out = []
    driver = Driver(
        fresh,
        params,
        prompts(6, lengths=(3, 20, 31)),
        group_size=2,
        eos_ids=EOS[:4],
        cfg=cfg,
        on_group=out.append,
    )
    compiled = driver.precompile()
    assert compiled.count("generate") == len(fresh.cache_windows) == 4
    # buckets 16 and 32, each for one prompt and for a batched fill (4 slots / G=2: 2 rows)
    assert compiled.count("prefill") == compiled.count("bulk_insert") == 4
    assert driver.precompile() == []
    with count_compilations() as compiles:
        driver.run()
    assert compiles == [] and len(out) == 6
    assert max(len(g.prompt_tokens) + len(c.tokens) for g in out for c in g.completions) > 48


def test_thread_mode_streams_groups_and_takes_updates(engine, params):
    cfg = dataclasses.replace(SCFG, interruptions=False, max_new_tokens=16)
    # a one-group queue: the driver cannot run ahead of the consumer by more than a group
    with Driver(
        engine, params, prompts(8), group_size=4, eos_ids=EOS, cfg=cfg, max_queued_groups=1
    ).start() as d:
        first = d.get(timeout=60)
        d.update_params(params, version=7)
        rest = list(iter(lambda: d.get(timeout=60), None))
    groups = [first] + rest
    assert len(groups) == 8 and all(len(g.completions) == 4 for g in groups)
    versions = np.concatenate([c.versions for g in groups for c in g.completions])
    assert set(versions.tolist()) == {0, 7}


def test_long_prompt_is_an_error_or_truncated_and_counted(engine, params, caplog):
    long = Prompt("long", list(range(150, 190)))  # 40 tokens > 32
    d = Driver(
        engine, params, [prompts(1)[0], long], group_size=2, eos_ids=EOS, phrase_ids=PHRASE
    ).start()
    # A user's error reaches the caller as itself (the programs print it in one line), with
    # the caller's frames and then the driver thread's; the driver logs no traceback of it.
    with pytest.raises(PromptTooLongError, match="'long' has 40 tokens > max_prefill_length=32"):
        while d.get(timeout=60) is not None:
            pass
    for _ in range(2):  # raised again by every later call, its traceback not growing
        with pytest.raises(PromptTooLongError) as err:
            d.join(timeout=60)
        frames = [f.f_code.co_name for f, _ in traceback.walk_tb(err.value.__traceback__)]
        assert frames[1:4] == ["join", "_raise_if_failed", "_thread_main"], frames
        assert frames[-1] == "_next_group" and frames.count("_thread_main") == 1, frames
    assert "sampler driver failed" not in caplog.text

    cfg = dataclasses.replace(SCFG, truncate_long_prompts=True, interruptions=False)
    (group,), d = collect(engine, params, [long], group_size=2, eos_ids=EOS, cfg=cfg)
    assert group.prompt_truncated and group.prompt_tokens.tolist() == list(range(158, 190))
    assert d.stats["truncated_prompts"] == 1


def test_errors_in_the_driver_thread_reach_the_caller(engine, params, caplog):
    def bad_prompts():
        yield prompts(1)[0]
        raise RuntimeError("prompt source broke")

    cfg = dataclasses.replace(SCFG, interruptions=False, max_new_tokens=8)
    d = Driver(engine, params, bad_prompts(), group_size=2, eos_ids=EOS, cfg=cfg).start()
    with pytest.raises(DriverError, match="prompt source broke"):
        for _ in range(10):
            d.get(timeout=60)
    with pytest.raises(DriverError):  # and it stays raised for every later call
        d.update_params(params, 1)
    assert "sampler driver failed" in caplog.text  # a bug's traceback is logged where it was

    def bad_callback(group):
        raise ValueError("consumer broke")

    d = Driver(
        engine, params, prompts(2), group_size=2, eos_ids=EOS, cfg=cfg, on_group=bad_callback
    ).start()
    with pytest.raises(DriverError, match="consumer broke"):
        d.join(timeout=60)

    with pytest.raises(ValueError, match="phrase_ids is empty"):
        Driver(engine, params, [], group_size=2, eos_ids=EOS)


def test_a_cfg_whose_compiled_fields_differ_from_the_engine_is_refused(engine, params):
    # The engine samples with its own temperature / top-k / top-p (compiled in): a driver cfg
    # that says otherwise used to be silently overridden.
    cfg = dataclasses.replace(SCFG, temperature=0.7, top_p=0.9, top_k=5)
    with pytest.raises(
        ValueError,
        match=r"temperature=0.7 \(engine: 1.0\), top_p=0.9 \(engine: "
        r"1.0\), top_k=5 \(engine: 0\)",
    ):
        Driver(engine, params, [], group_size=2, eos_ids=EOS, phrase_ids=PHRASE, cfg=cfg)
    with pytest.raises(ValueError, match=r"max_concurrent_decodes=8 \(engine: 4\)"):
        Driver(
            engine,
            params,
            [],
            group_size=2,
            eos_ids=EOS,
            phrase_ids=PHRASE,
            cfg=dataclasses.replace(SCFG, max_concurrent_decodes=8),
        )
    # driver-side fields may differ: that is what cfg is for
    Driver(
        engine,
        params,
        [],
        group_size=2,
        eos_ids=EOS,
        phrase_ids=PHRASE,
        cfg=dataclasses.replace(SCFG, think_min=3, think_max=9, max_new_tokens=20),
    )
    # ids that would never be read (interruptions off) are refused too
    off = dataclasses.replace(SCFG, interruptions=False)
    with pytest.raises(
        ValueError,
        match="think_close_ids and phrase_ids given but SamplerConfig.interruptions is False",
    ):
        Driver(
            engine,
            params,
            [],
            group_size=2,
            eos_ids=EOS,
            think_close_ids=CLOSE,
            phrase_ids=PHRASE,
            cfg=off,
        )


class _WordTokenizer:
    """Whitespace words -> ids from a table; unknown words are dropped (so text can encode to
    nothing), like a tokenizer whose vocabulary lacks them."""

    eos_ids = (100, 101)

    def __init__(self, table):
        self.table = table

    def encode(self, text, add_special_tokens=False):
        assert not add_special_tokens
        return [self.table[w] for w in text.split() if w in self.table]


def test_driver_token_ids_encode_the_config_strings_or_raise():
    from scalerl_jax.sampler import driver_token_ids

    tok = _WordTokenizer({"time": 240, "is": 241, "up.": 242, "</think>": 250})
    cfg = dataclasses.replace(
        SCFG, think_close="</think>", interruption_phrase="time is up. </think>"
    )
    ids = driver_token_ids(cfg, tok, max_forced_tokens=64)
    assert ids == dict(eos_ids=(100, 101), think_close_ids=(250,), phrase_ids=(240, 241, 242, 250))
    off = driver_token_ids(dataclasses.replace(cfg, interruptions=False), tok, max_forced_tokens=64)
    assert off == dict(eos_ids=(100, 101), think_close_ids=(), phrase_ids=())
    with pytest.raises(
        ValueError,
        match=r"interruption_phrase='time is up. </think>' encodes to "
        r"4 tokens > the engine's max_forced_tokens=3",
    ):
        driver_token_ids(cfg, tok, max_forced_tokens=3)
    with pytest.raises(ValueError, match=r"interruption_phrase='stop now' encodes to no token"):
        driver_token_ids(
            dataclasses.replace(cfg, interruption_phrase="stop now"), tok, max_forced_tokens=64
        )
    with pytest.raises(ValueError, match=r"think_close='</end>' encodes to no token"):
        driver_token_ids(dataclasses.replace(cfg, think_close="</end>"), tok, max_forced_tokens=64)


def test_for_tokenizer_forces_the_encoded_phrase(engine, params):
    tok = _WordTokenizer({"time": 240, "is": 241, "up.": 242, "</think>": 250})
    tok.eos_ids = tuple(EOS)
    cfg = dataclasses.replace(
        SCFG, think_close="</think>", interruption_phrase="time is up. </think>"
    )
    out = []
    driver = Driver.for_tokenizer(
        engine, params, prompts(2), tok, group_size=4, cfg=cfg, seed=3, on_group=out.append
    )
    driver.run()
    comps = [c for g in out for c in g.completions]
    assert len(comps) == 8 and any(c.interrupted for c in comps)
    for c in comps:
        if c.interrupted:
            start = int(np.argmax(c.forced))
            assert start == cfg.think_min
            assert c.tokens[start : start + 4].tolist() == [240, 241, 242, 250]
            assert c.forced.sum() == 4
