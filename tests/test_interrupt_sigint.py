"""Ctrl-C in a terminal: SIGINT to the whole process group of experiments/run.py, its reward
verifier children and its forecast child included. The children ignore it and are stopped by the
parent; the console shows the parent's lines and no child's traceback; a stop in the SFT warm-up
says how many of its steps are lost."""

import os
import re
import signal

from test_progress_signals import TESTBED, Lines, launch

SMALL = [a for a in TESTBED if a not in ("sft=none",)] + [
    "reward.processes=true",  # verifier children, as for every real dataset
    "reward.workers=2",
    "data.num_validation=16",
    "eval.num_prompts=16",
    "eval.k=2",
]


def launch_in_group(*args):
    return launch(*args, own_group=True)


def ctrl_c(out: Lines) -> tuple[int, str]:
    os.killpg(out.proc.pid, signal.SIGINT)
    code = out.finish(timeout=120)
    return code, out.text()


def test_ctrl_c_in_the_sft_warm_up_says_what_is_lost(tmp_path):
    workdir = str(tmp_path / "run")
    out = launch_in_group(
        "--workdir", workdir, *SMALL, "sft.steps=400", "sft.optim.total_steps=400"
    )
    out.wait_for(r"SFT warm-up: [1-9]\d*/400 steps", timeout=300)
    code, text = ctrl_c(out)
    assert code == 130, text[-3000:]
    assert "KeyboardInterrupt" not in text and "Traceback" not in text, text[-3000:]
    lost = re.search(r"SIGINT: the SFT warm-up's (\d+) of 400 steps are lost", text)
    assert lost and int(lost.group(1)) >= 1, text[-3000:]
    assert not os.path.exists(os.path.join(workdir, "sft", "summary.json"))


def test_ctrl_c_in_rl_stops_the_children_without_their_tracebacks(tmp_path):
    workdir = str(tmp_path / "run")
    out = launch_in_group("--workdir", workdir, "--steps", "40", *SMALL, "sft=none")
    out.wait_for(r"progress: \S+ [1-9]\d*/40 \(", timeout=300)
    code, text = ctrl_c(out)
    assert code == 130, text[-3000:]
    assert "KeyboardInterrupt" not in text and "Traceback" not in text, text[-3000:]
    assert "interrupted by SIGINT" in text or "SIGINT:" in text, text[-3000:]
