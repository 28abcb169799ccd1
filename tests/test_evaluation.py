"""experiments/eval.py on the CPU testbed: a run directory's checkpoint on its validation prompts,
the figures against the per-completion records, reproducibility, bad input, and a stop signal.
(The real model against an independent harness: tests/test_real_model.py.)"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from scalerl_jax import evaluation
from scalerl_jax.evaluation import summary_path
from scalerl_jax.rewards.pool import ScoreResult
from test_progress_signals import Lines, TESTBED
from test_run import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def eval_cmd(*args):
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),  # this checkout first
        "SCALERL_PROGRESS_INTERVAL": "1",
    }
    return [sys.executable, os.path.join(ROOT, "experiments", "eval.py"), *args], env


def run_eval(*args):
    cmd, env = eval_cmd(*args)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("eval") / "run")
    done = run_cli(
        "--workdir",
        workdir,
        "--steps",
        "1",
        *TESTBED,
        "data.num_validation=24",
        "eval.num_prompts=8",
        "eval.k=2",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir


def test_eval_of_a_run_checkpoint_on_its_validation_prompts(run_dir, tmp_path):
    out = str(tmp_path / "a.jsonl")
    args = (
        "--workdir",
        run_dir,
        "--num-prompts",
        "20",
        "--greedy",
        "--temperature",
        "1.0",
        "--k",
        "3",
        "--max-new-tokens",
        "48",
        "--slots",
        "16",
    )
    done = run_eval(*args, "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in open(out)]
    summary = json.load(open(summary_path(out)))
    assert summary["model"] == f"{run_dir} step 1" and summary["split"] == "run validation"
    greedy = [r for r in records if r["mode"] == "greedy"]
    sampled = [r for r in records if r["mode"] == "t1_k3"]
    assert len(greedy) == 20 and len(sampled) == 60 and len(records) == 80
    assert [r["index"] for r in greedy] == list(range(20))
    # The run's own validation prompts, as its trainer formats them, in its order.
    config = json.load(open(os.path.join(run_dir, "config.json")))
    assert config["data"]["num_validation"] == 24
    for r in records:
        assert r["prompt"] == r["question"] and len(r["completion_tokens"]) == r["num_tokens"]
        assert r["num_tokens"] <= 48 and (r["finish_reason"] == "truncated") == (
            r["num_tokens"] == 48 and r["completion_tokens"][-1] != 1
        )  # 1: <eos>
    # The figures are those of the records: pass@1, mean@k and pass@k with their errors.
    g, s = summary["modes"]["greedy"], summary["modes"]["t1_k3"]
    ok = np.array([r["correct"] for r in greedy], float)
    assert g["pass@1"] == pytest.approx(ok.mean())
    assert g["pass@1_se"] == pytest.approx(ok.std(ddof=1) / np.sqrt(20))
    per = np.array([r["correct"] for r in sampled], float).reshape(20, 3)
    assert [r["index"] for r in sampled[::3]] == list(range(20))
    assert s["mean@3"] == pytest.approx(per.mean())
    assert s["mean@3_se"] == pytest.approx(per.mean(axis=1).std(ddof=1) / np.sqrt(20))
    assert s["pass@3"] == pytest.approx(per.max(axis=1).mean())
    assert s["truncated"] == sum(r["finish_reason"] == "truncated" for r in sampled)
    assert "greedy (T=0): pass@1" in done.stdout and "t1_k3 (T=1): mean@3" in done.stdout

    # Seeded by (seed, problem, sample): the same command gives the same completions.
    again = str(tmp_path / "b.jsonl")
    assert run_eval(*args, "--out", again).returncode == 0
    assert [json.loads(line)["completion_tokens"] for line in open(again)] == [
        r["completion_tokens"] for r in records
    ]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--k", "4"], "--k 4 with --temperature 0: greedy decoding gives one completion"),
        (["--hf-checkpoint", "/nowhere"], "--data FILE is needed with --hf-checkpoint"),
        (["--workdir", "/tmp", "--hf-checkpoint", "/x"], "give one model"),
        (["--temperature", "-1"], "--temperature -1.0: must be >= 0"),
        (["--workdir", "/nonexistent-run"], "--workdir /nonexistent-run: no config.json there"),
        (["--workdir", "RUN", "optim.learning_rate=1"], "only data.* and reward.* settings"),
        (["--workdir", "RUN", "--recipe", "nope"], "--recipe nope: no such recipe"),
    ],
)
def test_bad_input_is_one_line_and_status_2(run_dir, args, message):
    done = run_eval(*[run_dir if a == "RUN" else a for a in args])
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr


def test_sigterm_stops_an_evaluation_within_seconds_writing_nothing(run_dir, tmp_path):
    out = tmp_path / "c.jsonl"
    cmd, env = eval_cmd(
        "--workdir",
        run_dir,
        "--temperature",
        "1.0",
        "--k",
        "64",
        "--max-new-tokens",
        "64",
        "--out",
        str(out),
    )
    lines = Lines(
        subprocess.Popen(
            cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    )
    lines.wait_for(r"sampling 24 problems x 64: [1-9]\d*/1536", timeout=300)  # compiled
    sent = time.monotonic()
    lines.proc.send_signal(signal.SIGTERM)
    assert lines.finish(timeout=60) == 143, lines.text()[-2000:]
    assert time.monotonic() - sent < 10.0
    # Said by the main thread, or by the watchdog when closing the verifier pool takes longer.
    assert re.search(
        r"eval.py: interrupted by SIGTERM; nothing written|SIGTERM: evaluation "
        r"stopped, nothing written; exiting now",
        lines.text(),
    ), lines.text()
    assert not out.exists() and not os.path.exists(summary_path(str(out)))


@pytest.mark.fast
def test_summary_figures_are_those_of_the_records(tmp_path):
    """mean@k, pass@k and their standard errors over problems, the counts, and the files."""
    # 3 problems x k=2: correct (1, 1), (1, 0), (0, 0); one truncated, one without an answer.
    correct = [True, True, True, False, False, False]
    records = [
        {
            "correct": c,
            "extracted": None if i == 5 else "1",
            "num_tokens": 4 + i,
            "finish_reason": "truncated" if i == 0 else "eos",
        }
        for i, c in enumerate(correct)
    ]
    scored = ScoreResult(np.zeros(6), np.array(correct), num_timeouts=1, num_errors=0, seconds=0.1)
    mode = evaluation.Mode("t1_k2", temperature=1.0, k=2)
    s = evaluation.summarize(records, mode, scored, {"tokens": 39}, 2.0, "math")
    per_problem_mean, per_problem_any = np.array([1, 0.5, 0]), np.array([1.0, 1.0, 0.0])
    assert s["mean@2"] == pytest.approx(0.5)
    assert s["mean@2_se"] == pytest.approx(per_problem_mean.std(ddof=1) / np.sqrt(3))
    assert s["pass@2"] == pytest.approx(2 / 3)
    assert s["pass@2_se"] == pytest.approx(per_problem_any.std(ddof=1) / np.sqrt(3))
    assert (s["problems"], s["completions"], s["correct"]) == (3, 6, 3)
    assert (s["no_answer"], s["truncated"], s["verifier_timeouts"]) == (1, 1, 1)
    assert s["mean_completion_tokens"] == 6.5 and s["tokens_per_s"] == 19.5
    line = evaluation.headline("t1_k2", s)
    assert line.startswith("t1_k2 (T=1): mean@2 0.500 ± 0.289, pass@2 0.667 ± 0.333 over 3")
    out = str(tmp_path / "sub" / "e.jsonl")
    assert evaluation.write_results(out, records, s) == str(tmp_path / "sub" / "e.summary.json")
    assert [json.loads(line) for line in open(out)] == records
    assert json.load(open(summary_path(out))) == s


@pytest.mark.fast
def test_data_only_is_scored_and_checked_before_the_model(tmp_path):
    """--data FILE alone is scored: a recipe's validation source (gsm8k's test.jsonl beside
    the train file) is neither needed nor read; --data and --recipe fail before any loading."""
    from scalerl_jax.cli import eval as script

    lone = tmp_path / "mine.jsonl"  # no test.jsonl beside it
    lone.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    args = script.parse_args(["--recipe", "gsm8k", "--hf-checkpoint", "M", "--data", str(lone)])
    data, _, validation = script.configs(args, None)
    assert (data.source, data.validation_source, validation) == (str(lone), None, False)
    assert data.prompt_field == "question" and data.answer_format == "gsm8k"
    missing = str(tmp_path / "typo.jsonl")
    with pytest.raises(script.preflight.UsageError, match="typo.jsonl"):
        script.configs(script.parse_args(["--hf-checkpoint", "M", "--data", missing]), None)


def test_a_bad_data_file_fails_before_the_checkpoint_is_restored(run_dir, tmp_path):
    done = run_eval("--workdir", run_dir, "--data", str(tmp_path / "typo.jsonl"))
    assert done.returncode == 2 and "typo.jsonl" in done.stderr, done.stderr[-2000:]
    assert "restoring step" not in done.stderr and "Traceback" not in done.stderr
