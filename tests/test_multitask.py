"""Multi-task data: a math + code mixture drawn by weight (deterministic, resumable), each
domain scored by its own verifier, per-domain curves in metrics.jsonl and TensorBoard, and
per-domain scaling fits (end of run and `experiments/fit.py --domain`)."""

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from scalerl_jax import recipes, rundir
from scalerl_jax.config import (
    ConfigError,
    DataConfig,
    DomainConfig,
    ModelConfig,
    RunConfig,
    apply_overrides,
    from_dict,
)
from scalerl_jax.data import CharTokenizer, DataError, MixtureSource, PromptSource, open_source
from scalerl_jax.data.synthetic_tasks import generate
from scalerl_jax.metrics import ComputeMeter, MetricsWriter, read_metrics
from scalerl_jax.rewards import RewardPool, answer_checks, domain_verifiers, verify_exact
from scalerl_jax.sampler.types import Completion, Group
from scalerl_jax.train.evaluate import score_groups
from scalerl_jax.train.feed import PromptFeed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = CharTokenizer()


def mix(math_weight=3.0, code_weight=1.0, seed=0, **kw):
    return DataConfig(
        source="mixture",
        num_validation=10,
        seed=seed,
        domains=(
            DomainConfig("math", "synthetic:countup?num=300", weight=math_weight),
            DomainConfig("code", "synthetic:pycode?num=200", weight=code_weight, **kw),
        ),
    )


# ------------------------------------------------------------------------------ the mixture
@pytest.mark.fast
def test_mixture_draws_by_weight_deterministically_and_resumes_exactly():
    source = open_source(mix(), TOK)
    assert isinstance(source, MixtureSource) and source.domains == ("math", "code")
    drawn = source.take(2000)
    counts = Counter(p.domain for p in drawn)
    assert abs(counts["math"] / 2000 - 0.75) < 0.03  # Binomial(2000, 0.75): sd 0.01
    # Prompts carry their domain; ids are unique across domains.
    assert all(p.prompt_id.startswith(p.domain + "/") for p in drawn)
    assert {p.prompt_id.split("/")[1] for p in drawn} == {"countup", "pycode"}
    # Same seed: the same stream; another seed: another one.
    again = open_source(mix(), TOK).take(2000)
    assert [p.prompt_id for p in again] == [p.prompt_id for p in drawn]
    other = open_source(mix(seed=1), TOK).take(200)
    assert [p.domain for p in other] != [p.domain for p in drawn[:200]]

    # Resume: a fresh source loaded with the cursor after 777 draws goes on exactly.
    cut = open_source(mix(), TOK)
    cut.take(777)
    state = json.loads(json.dumps(cut.state_dict()))  # checkpoints store it as JSON
    resumed = open_source(mix(), TOK)
    resumed.load_state_dict(state)
    assert [p.prompt_id for p in resumed.take(500)] == [p.prompt_id for p in drawn[777:1277]]
    # A single-source cursor does not fit a mixture, nor a mixture's another set of domains.
    with pytest.raises(DataError, match="saved domains None"):
        resumed.load_state_dict(PromptSource(mix().domain_data("math"), TOK).state_dict())
    renamed = dataclasses.replace(mix(), domains=(mix().domains[0],))
    with pytest.raises(DataError, match=r"saved domains \['math', 'code'\]"):
        open_source(renamed, TOK).load_state_dict(state)


def test_feed_checkpoint_covers_the_mixture_and_its_prompts_in_flight():
    feed = PromptFeed(open_source(mix(), TOK), TOK)
    issued = [next(feed) for _ in range(30)]
    for p in issued[:20]:
        feed.consumed(p.ticket)
    assert {p.metadata["domain"] for p in issued} == {"math", "code"}
    state = json.loads(json.dumps(feed.state_dict()))
    resumed = PromptFeed(open_source(mix(), TOK), TOK)
    resumed.load_state_dict(state)
    # In-flight prompts come back first under their tickets, then the stream continues.
    reference = PromptFeed(open_source(mix(), TOK), TOK)
    expected = [next(reference) for _ in range(40)][20:]
    got = [next(resumed) for _ in range(20)]
    assert [(p.prompt_id, p.metadata, p.ticket) for p in got] == [
        (p.prompt_id, p.metadata, p.ticket) for p in expected
    ]


def test_validation_keeps_each_domains_share_and_single_source_is_unchanged():
    cfg = dataclasses.replace(
        mix(),
        domains=(
            dataclasses.replace(mix().domains[0], num_validation=30),
            dataclasses.replace(mix().domains[1], num_validation=10),
        ),
    )
    val = open_source(cfg, TOK).validation()
    assert Counter(p.domain for p in val) == {"math": 30, "code": 10}
    assert Counter(p.domain for p in val[:20]) == {"math": 15, "code": 5}  # a cap keeps shares
    # One source: the same PromptSource as before mixtures existed, prompts of domain "".
    one = DataConfig(source="synthetic:countup?num=300", num_validation=10)
    plain, opened = PromptSource(one, TOK, id_field=one.id_field), open_source(one, TOK)
    assert type(opened) is PromptSource
    assert plain.take(50) == opened.take(50) and all(p.domain == "" for p in plain.take(5))


# -------------------------------------------------------------------------------- the config
def test_mixture_config_round_trips_and_takes_overrides():
    cfg = recipes.get("testbed-mix")
    assert from_dict(RunConfig, json.loads(cfg.to_json())) == cfg
    assert rundir.config_diff(json.loads(cfg.to_json()), cfg.to_dict()) == []
    changed = apply_overrides(
        cfg,
        [
            "data.domains.code.weight=3",
            "data.domains.sci.source=synthetic:addition",
            "data.domains.math=none",
        ],
    )
    assert [(d.name, d.weight) for d in changed.data.domains] == [("code", 3.0), ("sci", 1.0)]
    diffs = rundir.config_diff(json.loads(cfg.to_json()), changed.to_dict())
    assert diffs and all(key.startswith("data.domains") for key, *_ in diffs)
    # The documented override set turns testbed into testbed-mix, exactly.
    documented = recipes.documented_diff("testbed-mix", base="testbed")
    rebuilt = apply_overrides(recipes.testbed(), [f"{k}={v}" for k, v in documented.items()])
    assert dataclasses.replace(rebuilt, workdir=cfg.workdir) == cfg
    assert recipes.documented_diff("testbed-mix") is None  # not a scalerl variant


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["data.domains.code.weight=0"],
            r"DomainConfig\['code'\]\.weight=0\.0: must be a finite "
            r"number > 0",
        ),
        (["data.domains.code.weight=-2"], r"DomainConfig\['code'\]\.weight=-2\.0"),
        (
            ["data.domains.code.verifier=regex"],
            r"DomainConfig\['code'\]\.verifier='regex': must be "
            r"one of \('math', 'code', 'exact'\)",
        ),
        (["data.domains.new.weight=2"], r"DomainConfig\['new'\]\.source='': must be non-empty"),
        (
            ["data.source=synthetic:addition"],
            r"DataConfig\.source='synthetic:addition': must be "
            r"'mixture' when domains are set",
        ),
        (
            ["data.prompt_field=question"],
            r"DataConfig\.prompt_field='question': a mixture sets "
            r"this per domain",
        ),
        (
            ["data.domains=none"],
            r"DataConfig\.source='mixture': a mixture needs "
            r"DataConfig\.domains",
        ),
        (["data.domains.code.bogus=1"], r"has no field 'bogus'"),
    ],
)
def test_bad_mixture_configs_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(recipes.get("testbed-mix"), overrides)


def test_duplicate_domains_and_custom_verifier_in_a_mixture_are_refused():
    with pytest.raises(
        ConfigError,
        match=r"DataConfig\.domains=\['a', 'b', 'a'\]: domain names "
        r"must be unique; repeated: \['a'\]",
    ):
        DataConfig(
            source="mixture", domains=tuple(DomainConfig(n, "synthetic:addition") for n in "aba")
        )
    with pytest.raises(ConfigError, match=r"DomainConfig\.name='a b'"):
        DomainConfig("a b", "synthetic:addition")
    with pytest.raises(ConfigError, match="applies to a single source"):
        domain_verifiers(mix(), custom="_verifiers:even_length")
    with pytest.raises(
        ConfigError,
        match=r"DomainConfig\['code'\]\.verifier='nowhere:fn': "
        "cannot import it",
    ):
        domain_verifiers(mix(verifier="nowhere:fn"))


# ------------------------------------------------------------------------------ the scoring
def _group(domain, answer, texts):
    completions = [
        Completion(
            np.array(TOK.encode(t) + [TOK.eos_id], np.int32),
            np.zeros(len(TOK.encode(t)) + 1, np.float32),
            np.zeros(len(TOK.encode(t)) + 1, bool),
            np.zeros(len(TOK.encode(t)) + 1, np.int32),
            "eos",
        )
        for t in texts
    ]
    return Group(
        f"{domain}/x", np.array([4], np.int32), completions, {"answer": answer, "domain": domain}
    )


def test_each_group_is_scored_by_its_domains_verifier():
    verifiers = domain_verifiers(mix())
    assert verifiers["math"] is verify_exact
    from scalerl_jax.rewards.code import verify_code

    assert verifiers["code"].func is verify_code
    assert verifiers["code"].keywords == {"isolation": "strong"}
    code_row = generate("pycode", 1, 0)[0]  # "code n*A+B=", its program, its test spec
    good, bad = code_row.demo_answer, code_row.demo_answer.replace("*", "+")
    groups = [
        _group("math", "85", ["<think>81:4</think>85", "<think></think>84"]),
        _group("code", code_row.answer, [f"<think>x</think>{good}", f"<think></think>{bad}"]),
        # The math answer under the code verifier is not a passing program.
        _group("code", code_row.answer, ["<think></think>85", f"<think></think>{good}"]),
    ]
    with RewardPool(2, 10.0, reward_correct=1.0, reward_incorrect=0.0) as pool:
        scored = score_groups(groups, tokenizer=TOK, verifier=verifiers, pool=pool)
        single = score_groups(groups[:1], tokenizer=TOK, verifier=verify_exact, pool=pool)
        with pytest.raises(KeyError, match="domain 'sci', which has no verifier"):
            score_groups([_group("sci", "1", ["1"])], tokenizer=TOK, verifier=verifiers, pool=pool)
    assert scored.correct.tolist() == [True, False, True, False, False, True]
    assert scored.rewards.tolist() == [1, 0, 1, 0, 0, 1] and scored.num_errors == 0
    assert single.correct.tolist() == [True, False]


def test_pycode_demonstrations_pass_and_malformed_code_rows_are_skipped(tmp_path):
    from scalerl_jax.rewards.code import verify_code

    rows = generate("pycode", 40, 3, direct=0.5)
    for r in rows:
        TOK.encode(r.prompt + r.completion)  # the character vocabulary covers the programs
        assert verify_code(r.completion, r.answer) == (r.demo_answer == right_program(r)), r
    assert 0 < sum(r.thought == "" for r in rows) < 40
    # A JSONL code domain: a row with a malformed test spec is bad, counted and skipped.
    path = tmp_path / "code.jsonl"
    lines = [{"problem": f"task {i}", "answer": r.answer} for i, r in enumerate(rows)]
    lines[5]["answer"] = json.dumps({"inputs": ["1\n"]})  # no outputs
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    data = DataConfig(
        source="mixture",
        num_validation=2,
        max_bad_fraction=0.1,
        domains=(
            DomainConfig("code", str(path), verifier="code"),
            DomainConfig("math", "synthetic:countup?num=50"),
        ),
    )
    source = open_source(data, TOK, check_answers=answer_checks(data))
    assert source.sources["code"].stats.bad and source.sources["code"].stats.kept == 39
    strict = dataclasses.replace(data, max_bad_fraction=0.0)
    with pytest.raises(DataError, match=r"data\.domains\.code: .*1 of 40 rows are malformed"):
        open_source(strict, TOK, check_answers=answer_checks(strict))


def right_program(row):
    """The right program for a pycode prompt "code n*A+B=", from the prompt's numbers."""
    mul, add = row.prompt[len("code n*") : -1].split("+")
    return f"print(int(input())*{int(mul)}+{int(add)})"


# ------------------------------------------------------------------ curves, TensorBoard, fits
def _sigmoid(c, a, b, c_mid, r0):
    return r0 + (a - r0) / (1 + (c_mid / c) ** b)


def write_mixture_metrics(workdir, n=14):
    """A mixture run's metrics.jsonl: two domains with their own sigmoid curves."""
    meter = ComputeMeter(1e6, 2, 64)
    rng = np.random.default_rng(0)
    with MetricsWriter(workdir) as w:
        w.write("run", 0, schema=1, config={})
        for i in range(n):
            meter.add_trainer(
                seconds=3600.0 * (0.4 if i else 0.0), devices=1, tokens=0, context_len=1
            )
            c = meter.compute()["device_hours"]
            math_r = _sigmoid(c, 0.8, 1.8, 2.0, 0.2) if c > 0 else 0.2
            code_r = _sigmoid(c, 0.5, 1.2, 1.0, 0.1) if c > 0 else 0.1
            per = {"math": math_r + rng.normal(0, 0.003), "code": code_r + rng.normal(0, 0.003)}
            w.eval(
                i,
                pass_rate=(per["math"] + per["code"]) / 2,
                k=4,
                compute=meter.compute(),
                per_domain=per,
                per_domain_se={"math": 0.01, "code": 0.01},
                per_domain_prompts={"math": 100, "code": 100},
            )


def test_end_of_run_fit_and_fit_cli_fit_each_domain(tmp_path):
    from scalerl_jax.scaling import report

    workdir = str(tmp_path / "mixrun")
    write_mixture_metrics(workdir)
    analysis, files = report.fit_run_dir(workdir, n_boot=0, plots=False)
    assert set(analysis.domains) == {"code", "math"} and analysis.fit.ok
    heads = report.domain_headlines(analysis)
    assert abs(heads["math"]["A"] - 0.8) < 0.05 and abs(heads["code"]["A"] - 0.5) < 0.05
    for domain in ("math", "code"):
        fit = json.load(open(os.path.join(workdir, "fit", domain, "fit.json")))
        assert fit["y_key"] == f"per_domain.{domain}" and fit["run"] == f"mixrun:{domain}"
    table = open(os.path.join(workdir, "fit", "fit.txt")).read()
    assert [line.split()[0] for line in table.splitlines()[1:4]] == [
        "mixrun",
        "mixrun:code",
        "mixrun:math",
    ]

    def fit_cli(*args):
        return subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, "experiments", "fit.py"),
                *args,
                "--bootstrap",
                "0",
                "--no-plots",
                "--extrapolate",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )

    done = fit_cli(workdir, "--domain", "code")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith("mixrun:code")
    assert (
        abs(json.load(open(os.path.join(workdir, "fit", "code", "fit.json")))["fit"]["A"] - 0.5)
        < 0.05
    )
    done = fit_cli(workdir, "--domain", "chess")
    assert done.returncode == 2 and "its domains: ['code', 'math']" in done.stderr


def test_tensorboard_gets_the_per_domain_values(tmp_path):
    from test_tracking import read_scalars

    from scalerl_jax.tracking import Tracker

    workdir = str(tmp_path / "tb")
    write_mixture_metrics(workdir, n=3)
    with Tracker(workdir) as tracker:
        for record in read_metrics(workdir).events:
            tracker.write(record)
        tracker.write({"event": "train", "step": 1, "per_domain_train": {"math": 0.5}})
    rl = read_scalars(os.path.join(workdir, "tensorboard", "rl"))
    assert {
        "eval/per_domain/code",
        "eval/per_domain_se/math",
        "train/per_domain_train/math",
        "eval/per_domain_prompts/code",
    } <= set(rl)
    assert [v for _, v in rl["train/per_domain_train/math"]] == [0.5]
    vs = read_scalars(os.path.join(workdir, "tensorboard", "vs_compute"))
    assert len(vs["eval/per_domain/code_vs_device_seconds"]) == 3


# ---------------------------------------------------------------- a short mixed testbed run
def test_a_short_math_and_code_run_logs_both_domains_curves(tmp_path):
    from scalerl_jax.config import MeshConfig
    from scalerl_jax.train import trainer

    tiny = ModelConfig(
        name="tiny",
        vocab_size=TOK.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        max_position_embeddings=64,
        tie_embeddings=True,
    )
    cfg = dataclasses.replace(
        recipes.get("testbed-mix"),
        model=tiny,
        sft=None,
        steps=3,
        workdir=str(tmp_path / "mix"),
        mesh=MeshConfig(trainer_devices_per_host=4),
    )
    cfg = apply_overrides(
        cfg,
        [
            "data.domains.math.source=synthetic:countup?num=200",
            "data.domains.code.source=synthetic:pycode?num=200",
            "data.num_validation=4",
            "reward.workers=2",
            "sampler.max_concurrent_decodes=16",
            "sampler.max_target_length=40",
            "sampler.max_new_tokens=20",
            "sampler.think_min=8",
            "sampler.think_max=12",
            "pipeline.mode=sync",
            "pipeline.prompts_per_step=4",
            "pipeline.generations_per_prompt=2",
            "eval.every_steps=2",
            "eval.num_prompts=8",
            "eval.k=2",
            "checkpoint_every=2",
        ],
    )
    result = trainer.run(cfg, fit=True)
    log = read_metrics(cfg.workdir)
    evals, train = log.of("eval"), log.of("train")
    assert [e["step"] for e in evals] == [0, 2, 3]
    for e in evals:
        assert set(e["per_domain"]) == {"math", "code"}
        assert e["per_domain_prompts"] == {"math": 4, "code": 4}
        assert set(e["per_domain_se"]) == {"math", "code"}
        assert e["pass_rate"] == pytest.approx(np.mean(list(e["per_domain"].values())))
    drawn = Counter()
    for r in train:
        drawn.update(r["per_domain_prompts_train"])
        assert set(r["per_domain_train"]) == set(r["per_domain_prompts_train"])
    assert sum(drawn.values()) == 12 and set(drawn) == {"math", "code"}
    assert set(result.domain_fits) == {"math", "code"}  # 3 points each: reasons, not numbers
    assert all("too few points" in f["reason"] for f in result.domain_fits.values())
    assert os.path.exists(os.path.join(cfg.workdir, "fit", "code", "fit.json"))
