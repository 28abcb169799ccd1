"""Prompt data: loading with bad rows, validation split, host shards, epochs, cursor, synthetic."""

import dataclasses
import json
import logging
import os
import random
import re
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalerl_jax.config import ConfigError, DataConfig
from scalerl_jax.data import (
    TASKS,
    CharTokenizer,
    DataError,
    PromptSource,
    answer_reader,
    format_prompt,
    generate,
    gsm8k_answer,
    load_rows,
)
from scalerl_jax.rewards import verify_exact


def _good(i):
    return {
        "id": f"q{i}",
        "problem": f"What is {i} + {i}? Put it in \\boxed{{}}.",
        "answer": str(2 * i),
    }


BAD_LINES = [
    '{"problem": "no answer here"}',  # missing answer
    '{"id": "x", "problem": ["a list"], "answer": "1"}',  # wrong type
    '{"problem": "   ", "answer": "1"}',  # empty
    '{"problem": "truncated", "answ',  # invalid JSON
    "[1, 2, 3]",
]  # not an object


def _write_jsonl(path, n_good, bad_lines, seed=0):
    lines = [json.dumps(_good(i)) for i in range(n_good)] + list(bad_lines)
    random.Random(seed).shuffle(lines)
    path.write_text("\n".join(lines) + "\n\n")  # a blank line is not a row
    return path


@pytest.mark.fast
def test_jsonl_bad_rows_counted(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", 600, BAD_LINES)
    rows, stats = load_rows(DataConfig(source=str(path)))
    assert len(rows) == 600 and stats.records == 605 and stats.num_bad == 5
    assert stats.bad == {
        "missing 'answer'": 1,
        "wrong type of 'problem' (list)": 1,
        "empty 'problem'": 1,
        "invalid JSON": 1,
        "not an object (list)": 1,
    }
    assert {r.prompt_id for r in rows} == {f"q{i}" for i in range(600)}
    assert dict((r.prompt_id, r.answer) for r in rows)["q7"] == "14"


def test_too_many_bad_rows_raises_with_numbers(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", 100, BAD_LINES * 2)
    with pytest.raises(
        DataError,
        match=r"10 of 110 rows are malformed \(9\.09% > "
        r"max_bad_fraction=1\.00%\).*invalid JSON: 2",
    ):
        load_rows(DataConfig(source=str(path)))
    rows, _ = load_rows(DataConfig(source=str(path), max_bad_fraction=0.1))  # tolerated
    assert len(rows) == 100


def test_parquet_nested_fields_and_bad_rows(tmp_path):
    records = [
        {"uid": i, "meta": {"question": f"q {i}?"}, "solution": {"final": i * 3}}
        for i in range(300)
    ]
    records[5]["meta"]["question"] = None  # null
    records[9]["meta"]["question"] = ""  # empty
    records[11]["solution"] = None  # missing nested answer
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    config = DataConfig(
        source=str(path),
        prompt_field="meta.question",
        answer_field="solution.final",
        max_bad_fraction=0.02,
    )
    rows, stats = load_rows(config, id_field="uid")
    assert stats.records == 300 and len(rows) == 297
    assert stats.bad == {
        "missing 'meta.question'": 1,
        "empty 'meta.question'": 1,
        "missing 'solution.final'": 1,
    }
    assert rows[0].prompt_id == "0" and rows[0].answer == "0" and rows[3].answer == "9"
    strict = dataclasses.replace(config, max_bad_fraction=0.01)
    assert len(load_rows(strict)[0]) == 297  # exactly 1% bad is allowed
    records[12]["meta"]["question"] = "  \n"  # blank: the 4th bad row
    pq.write_table(pa.Table.from_pylist(records), path)
    with pytest.raises(DataError, match=r"4 of 300 rows are malformed \(1\.33% > "):
        load_rows(strict)


def test_json_array_directory_duplicates_and_hash_ids(tmp_path):
    rows = [{"problem": f"p{i}", "answer": i} for i in range(50)]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.json").write_text(json.dumps(rows[:30]))
    (tmp_path / "d" / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows[25:]))
    got, stats = load_rows(DataConfig(source=str(tmp_path / "d")))
    assert len(got) == 50 and stats.duplicates == 5  # p25..p29 appear twice
    assert all(re.fullmatch(r"h[0-9a-f]{20}", r.prompt_id) for r in got)  # no id field


def test_source_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_rows(DataConfig(source=str(tmp_path / "missing.jsonl")))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type"):
        load_rows(DataConfig(source=str(tmp_path / "x.csv")))
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(DataError, match="pip install datasets"):
            load_rows(DataConfig(source="hf:some/dataset"))
    try:
        import tensorflow_datasets  # noqa: F401
    except ImportError:
        with pytest.raises(DataError, match=r"scalerl_jax\[tfds\]"):
            load_rows(DataConfig(source="tfds:gsm8k"))
    with pytest.raises(DataError, match="unknown"):
        load_rows(DataConfig(source="synthetic:nope"))
    path = _write_jsonl(tmp_path / "t.jsonl", 20, [])
    with pytest.raises(DataError, match="num_validation=20 leaves no training prompts"):
        PromptSource(DataConfig(source=str(path), num_validation=20))


def test_hf_and_tfds_sources_with_stand_in_modules(tmp_path, monkeypatch):
    """The optional packages are not installed here: stand-ins check the calls and conversion."""
    calls = []

    def load_dataset(name, config=None, split=None, **kw):
        calls.append((name, config, split, kw))
        return [{"question": f"q{i}", "answer": i} for i in range(20)]

    fake_datasets = types.SimpleNamespace(
        load_dataset=load_dataset, DatasetDict=dict, load_from_disk=None
    )
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets)
    rows, _ = load_rows(DataConfig(source="hf:openai/gsm8k:main", prompt_field="question"))
    assert calls == [("openai/gsm8k", "main", "train", {})] and len(rows) == 20
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "dataset_dict.json").write_text("{}")
    fake_datasets.load_from_disk = lambda path: {"test": [{"problem": "p", "answer": "1"}]}
    rows, _ = load_rows(DataConfig(source=f"hf:{saved}", split="test"))
    assert rows[0].problem == "p"

    class Scalar:  # a 0-d numpy value as tfds.as_numpy yields it
        ndim = 0

        def __init__(self, v):
            self.v = v

        def item(self):
            return self.v

    fake_tfds = types.SimpleNamespace(
        load=lambda name, split: (name, split),
        as_numpy=lambda ds: [{"problem": b"bytes problem", "answer": Scalar(7)}],
    )
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake_tfds)
    rows, _ = load_rows(DataConfig(source="tfds:gsm8k"))
    assert rows[0].problem == "bytes problem" and rows[0].answer == "7"


def _source(path, **kw):
    config = DataConfig(
        source=str(path),
        num_validation=kw.pop("num_validation", 50),
        **{k: kw.pop(k) for k in list(kw) if k in ("seed", "template", "system_prompt")},
    )
    return PromptSource(config, **kw)


def test_validation_split_disjoint_deterministic_order_free(tmp_path):
    a = _source(_write_jsonl(tmp_path / "a.jsonl", 400, BAD_LINES[:2], seed=1))
    b = _source(_write_jsonl(tmp_path / "b.jsonl", 400, BAD_LINES[:2], seed=2))  # shuffled
    val_a = {p.prompt_id for p in a.validation()}
    assert len(val_a) == 50 and val_a == {p.prompt_id for p in b.validation()}
    train = set(a.shard_ids())
    assert not train & val_a and len(train) == 350 and a.num_train == 350
    other_seed = _source(tmp_path / "a.jsonl", seed=1)
    assert {p.prompt_id for p in other_seed.validation()} != val_a


def test_host_shards_disjoint_covering_and_one_epoch_each(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", 301, [])
    full = set(_source(path).shard_ids())
    hosts = [_source(path, process_index=p, process_count=4) for p in range(4)]
    shards = [set(h.shard_ids()) for h in hosts]
    assert sum(len(s) for s in shards) == len(full) and set().union(*shards) == full
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    for host, shard in zip(hosts, shards):
        epoch0 = [p.prompt_id for p in host.take(len(shard))]
        assert sorted(epoch0) == sorted(shard) and host.epoch == 0
        epoch1 = [p.prompt_id for p in host.take(len(shard))]
        assert sorted(epoch1) == sorted(shard) and host.epoch == 1 and epoch1 != epoch0
    val = [set(p.prompt_id for p in h.validation(shard=True)) for h in hosts]
    assert set().union(*val) == {p.prompt_id for p in hosts[0].validation()}
    assert sum(map(len, val)) == 50
    with pytest.raises(DataError, match="process_index=4"):
        _source(path, process_index=4, process_count=4)


@pytest.mark.fast
def test_cursor_roundtrip_resumes_exactly(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", 130, [])
    run = _source(path, process_index=1, process_count=2)  # shard of 40
    run.take(57)  # into the second epoch
    state = json.loads(json.dumps(run.state_dict()))  # JSON-able
    expected = [p.prompt_id for p in run.take(70)]
    resumed = _source(path, process_index=1, process_count=2)
    resumed.load_state_dict(state)
    assert [p.prompt_id for p in resumed.take(70)] == expected
    assert resumed.state_dict() == run.state_dict()
    other_layout = _source(path, process_index=0, process_count=2)
    with pytest.raises(DataError, match="saved process_index=1, now 0"):
        other_layout.load_state_dict(state)
    changed = _write_jsonl(tmp_path / "u.jsonl", 131, [])
    with pytest.raises(DataError, match="num_train"):
        _source(changed, process_index=1, process_count=2).load_state_dict(state)


def test_skip_predicate_retires_prompts(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", 100, [])
    retired = set()
    src = _source(path, skip=retired.__contains__)
    first = [p.prompt_id for p in src.take(10)]
    retired.update(first)
    later = [p.prompt_id for p in src.take(200)]  # spans several epochs
    assert not retired & set(later) and len(set(later)) == 40
    retired.update(src.shard_ids())
    with pytest.raises(DataError, match="all 50 prompts .* retired"):
        next(src)


def test_templates_and_chat(tmp_path):
    cfg = DataConfig(template="Solve: {prompt}\nThink step by step.", system_prompt="Be brief.")
    text = format_prompt("What is \\boxed{x}?", cfg)
    assert text == "Be brief.\n\nSolve: What is \\boxed{x}?\nThink step by step."
    cfg = DataConfig(template="{system}|{prompt}", system_prompt="S")
    assert format_prompt("p", cfg) == "S|p"
    tok = CharTokenizer()
    chat = DataConfig(
        source="synthetic:addition?num=200",
        template="chat",
        system_prompt="add.",
        num_validation=10,
    )
    src = PromptSource(chat, tok)
    p = next(src)
    assert p.text == f"add.\nq:{p.problem}\na:" and tok.decode(tok.encode(p.text)) == p.text
    with pytest.raises(DataError, match="needs a tokenizer"):
        PromptSource(chat)


# ------------------------------------------------------------------------------- synthetic
# Exact-match tasks; pycode's answers are test specs run by a program (tests/test_multitask.py).
@pytest.mark.parametrize("task", [t for t in TASKS if t != "pycode"])
def test_synthetic_tasks_deterministic_distinct_verifiable(task):
    rows = generate(task, 300, seed=3)
    assert rows == generate(task, 300, seed=3) and rows != generate(task, 300, seed=4)
    assert len({r.prompt for r in rows}) == 300
    tok = CharTokenizer()
    for r in rows:
        tok.encode(r.prompt + r.answer)  # every character is in the vocabulary
        assert r.answer == _solve(r.prompt)
        assert verify_exact(f"<think>working</think>{r.answer}", r.answer)
        assert not verify_exact(f"<think>{r.answer}", r.answer)
        assert not verify_exact(f"<think>x</think>{r.answer}0", r.answer)
        # The demonstration closes its thought and ends with the answer.
        assert r.completion.startswith("<think>")
        assert r.completion.endswith(f"</think>{r.answer}")


def test_countup_counts_on_and_direct_share_answers_from_memory():
    worked = generate("countup", 300, seed=2, max_start=499)
    mixed = generate("countup", 300, seed=2, max_start=499, direct=0.6)
    assert [r.prompt for r in worked] == [r.prompt for r in mixed]  # same problems either way
    for r in worked:
        a, b = map(int, re.fullmatch(r"(\d+)\+(\d+)=", r.prompt).groups())
        assert r.thought.split(",") == [f"{a + i}:{b - i}" for i in range(1, b + 1)]
        assert (
            r.completion
            == f"<think>{r.thought}</think>{a + b}"
            == f"<think>{r.thought}</think>{r.answer}"
        )
    quick = [r for r in mixed if not r.thought]
    assert 140 <= len(quick) <= 220  # ~60% of 300
    assert all(abs(int(r.demo_answer) - int(r.answer)) <= 3 for r in quick)
    assert 0.05 < sum(r.demo_answer == r.answer for r in quick) / len(quick) < 0.3  # ~1/7
    assert all(r.completion == f"<think></think>{r.demo_answer}" for r in quick)


def test_countup_direct_hard_counts_on_less_the_more_there_is_to_add():
    base = generate("countup", 2000, seed=3, max_start=499)
    rows = generate("countup", 2000, seed=3, max_start=499, direct=0.5, direct_hard=0.99)
    assert [r.prompt for r in rows] == [r.prompt for r in base]  # same problems either way
    counted = {b: [] for b in range(2, 10)}
    for r in rows:
        counted[int(r.prompt[:-1].split("+")[1])].append(bool(r.thought))
    share = {b: sum(v) / len(v) for b, v in counted.items()}
    # 1 - direct at b = 2, 1 - direct_hard at b = 9, log-linear between (b = 5: 0.5 * 0.02^(3/7)).
    assert 0.38 < share[2] < 0.62 and 0.05 < share[5] < 0.15 and share[9] < 0.04
    assert share[2] > share[4] > share[6] > share[9]
    uniform = generate("countup", 2000, seed=3, max_start=499, direct=0.5)
    assert 0.4 < sum(bool(r.thought) for r in uniform) / 2000 < 0.6
    with pytest.raises(ValueError, match="direct_hard"):
        generate("countup", 10, direct=0.5, direct_hard=1.0)


def test_chain_thought_is_a_correct_running_sum():
    rows = generate("chain", 200, seed=1, min_terms=2, max_terms=6, digits=2)
    assert {len(re.findall(r"[+-]", r.prompt)) for r in rows} == {1, 2, 3, 4, 5}
    for r in rows:
        steps = r.thought.split(",")
        assert len(steps) == len(re.findall(r"[+-]", r.prompt))
        for i, s in enumerate(steps):
            a, op, b, out = re.fullmatch(r"(\d+)([+-])(\d+)=(\d+)", s).groups()
            assert int(out) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
            if i:  # each step starts from the previous running sum
                assert a == steps[i - 1].split("=")[1]
        assert steps[-1].split("=")[1] == r.answer


def _solve(prompt):
    """Independent recomputation of each task's answer from its prompt text."""
    if m := re.fullmatch(r"(\d+(?:[+-]\d+)+)=", prompt):
        total, terms = 0, re.findall(r"([+-]?)(\d+)", m.group(1))
        for sign, x in terms:
            total += -int(x) if sign == "-" else int(x)
        return str(total)
    if m := re.fullmatch(r"reverse:([a-z]+)=", prompt):
        return m.group(1)[::-1]
    m = re.fullmatch(r"count ([a-z]):([a-z]+)=", prompt)
    return str(m.group(2).count(m.group(1)))


def test_synthetic_knobs_and_limits():
    rows = generate("addition", 50, min_digits=4, max_digits=4)
    assert all(re.fullmatch(r"\d{4}\+\d{4}=", r.prompt) for r in rows)
    with pytest.raises(ValueError, match="only 100 distinct problems"):
        generate("addition", 101, max_digits=1)
    with pytest.raises(ValueError, match="bad knobs"):
        generate("reverse", 10, digits=3)
    src = PromptSource(DataConfig(source="synthetic:reverse?max_len=4&num=120", num_validation=20))
    assert src.num_train == 100 and all(len(p.answer) <= 4 for p in src.take(100))


def test_char_tokenizer():
    tok = CharTokenizer()
    assert 32 <= tok.vocab_size <= 64 and tok.bos_id is None
    ids = tok.encode("<think>12+34</think>46")
    assert ids[0] == tok.think_id and tok.think_close_id in ids and len(ids) == 9
    assert (
        tok.decode(ids + [tok.eos_id, tok.pad_id], skip_special_tokens=True)
        == "<think>12+34</think>46"
    )
    assert tok.decode([tok.eos_id]) == "<eos>" and tok.eos_ids == (tok.eos_id,)
    assert tok.encode("1", add_special_tokens=True) == tok.encode("1")  # no BOS
    assert len({tok.pad_id, tok.eos_id, tok.think_id, tok.think_close_id}) == 4
    with pytest.raises(ValueError, match="'Q' at position 0"):
        tok.encode("Q")
    msgs = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == "q:1+1=\na:2\n"


# --------------------------------------------------------------------- answer formats, GSM8K
# A directory holding GSM8K's train.jsonl and test.jsonl (the tests that read them skip without).
GSM8K = os.environ.get("SCALERL_GSM8K_DIR", "<SCALERL_GSM8K_DIR unset>")
GSM8K_ABSENT = "set SCALERL_GSM8K_DIR to a directory holding GSM8K's train.jsonl and test.jsonl"


def gsm8k_lines(split, *numbers):
    """Rows of the real GSM8K file by line number (1-based); skip when the data is absent."""
    path = os.path.join(GSM8K, f"{split}.jsonl")
    if not os.path.isfile(path):
        pytest.skip(f"{path} absent: {GSM8K_ABSENT}")
    with open(path) as f:
        lines = f.readlines()
    return [json.loads(lines[n - 1]) for n in numbers]


def test_gsm8k_answer_format_on_real_rows():
    plain, thousands, big, negative, negative2 = gsm8k_lines("train", 1, 346, 368, 5716, 5845)
    assert plain["answer"].endswith("#### 72") and gsm8k_answer(plain["answer"]) == "72"
    assert thousands["answer"].endswith("#### 1,080")
    assert gsm8k_answer(thousands["answer"]) == "1080"
    assert gsm8k_answer(big["answer"]) == "850000"  # "850,000"
    assert gsm8k_answer(negative["answer"]) == "-7" and gsm8k_answer(negative2["answer"]) == "-47"
    (test_thousands,) = gsm8k_lines("test", 202)
    assert gsm8k_answer(test_thousands["answer"]) == "114200"  # "#### 114,200"
    read = answer_reader("gsm8k")
    assert read is gsm8k_answer and answer_reader("raw")(" 72\n") == "72"


@pytest.mark.parametrize(
    "text,why",
    [
        ("She has 5 apples.", "no '####' line"),
        ("5 + 2 = 7\n#### seven", "not a number"),
        ("#### 1,08", "not a number"),  # a broken thousands group
        ("#### 12,3456", "not a number"),
        ("#### ", "not a number"),
    ],
)
def test_gsm8k_answer_format_refuses_what_it_cannot_read(text, why):
    with pytest.raises(ValueError, match=why):
        gsm8k_answer(text)


def test_boxed_answer_format():
    read = answer_reader("boxed")
    assert read(r"So $x = 2$, and the answer is $\boxed{\frac{1}{2}}$.") == r"\frac{1}{2}"
    # Inner boxes are flattened (they hide nothing); joined boxes state one list.
    assert read(r"First \boxed{3}, then \boxed{x = \boxed{5}}") == "x = 5"
    assert read(r"so $\boxed{2}$ and $\boxed{3}$.") == "2, 3"
    for text, why in (
        (r"no box here", "no \\\\boxed"),
        (r"\boxed{12", "not closed"),
        (r"\boxed{ }", "empty"),
    ):
        with pytest.raises(ValueError, match=why):
            read(text)
    with pytest.raises(ConfigError, match=r"answer_format='hash'.*\('raw', 'gsm8k', 'boxed'\)"):
        DataConfig(answer_format="hash")


def test_answer_format_rows_skipped_and_counted(tmp_path):
    good = [
        {
            "question": f"What is {i} times 1,000?",
            "answer": f"{i} x 1000 = <<{i}*1000={i}000>>{i}000\n#### {i},000",
        }
        for i in range(1, 201)
    ]
    bad = [
        {"question": "q no mark", "answer": "It is 4."},
        {"question": "q words", "answer": "#### four"},
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in good + bad) + "\n")
    config = DataConfig(
        source=str(path), prompt_field="question", answer_format="gsm8k", max_bad_fraction=0.01
    )
    rows, stats = load_rows(config)
    assert len(rows) == 200 and rows[2].answer == "3000"
    assert stats.bad == {
        "bad 'answer' (no '####' line with the final answer)": 1,
        "bad 'answer' (the text after '####' is not a number)": 1,
    }
    path.write_text("\n".join(json.dumps(r) for r in good[:50] + bad) + "\n")
    with pytest.raises(DataError, match=r"2 of 52 rows are malformed"):
        load_rows(config)
    with pytest.raises(DataError, match="synthetic tasks give their answers as they are"):
        load_rows(DataConfig(source="synthetic:countup?num=10", answer_format="gsm8k"))


def _qa_file(path, items):
    path.write_text(
        "\n".join(json.dumps({"question": q, "answer": f"... #### {a}"}) for q, a in items) + "\n"
    )
    return str(path)


def test_validation_from_its_own_file(tmp_path):
    train = _qa_file(
        tmp_path / "train.jsonl", [(f"train q{i}", i) for i in range(40)] + [("shared q", 7)]
    )
    _qa_file(tmp_path / "test.jsonl", [(f"test q{i}", -i) for i in range(12)] + [("shared q", 7)])
    config = DataConfig(
        source=train,
        prompt_field="question",
        answer_format="gsm8k",
        validation_source="{data_dir}/test.jsonl",
        num_validation=100,
    )
    src = PromptSource(config)
    val = src.validation()
    # Every test row is validation (fewer than num_validation), none is held out of train;
    # the train copy of a validation problem is dropped and counted.
    assert sorted(p.problem for p in val) == sorted(
        [f"test q{i}" for i in range(12)] + ["shared q"]
    )
    assert src.num_train == 40 and src.num_overlap == 1
    assert all(p.prompt_id.startswith("test:") for p in val)
    assert {p.problem for p in src.take(40)} == {f"train q{i}" for i in range(40)}
    assert dict((p.problem, p.answer) for p in val)["test q3"] == "-3"
    assert src.validation_stats.kept == 13
    # num_validation caps it, in the same hash order.
    few = PromptSource(dataclasses.replace(config, num_validation=5)).validation()
    assert [p.prompt_id for p in few] == [p.prompt_id for p in val[:5]]
    # Unset: held out of the training file as before.
    held = PromptSource(dataclasses.replace(config, validation_source=None, num_validation=5))
    assert held.num_train == 36 and all(
        p.problem.startswith(("train", "shared")) for p in held.validation()
    )
    with pytest.raises(DataError, match="no such file"):
        PromptSource(dataclasses.replace(config, validation_source="{data_dir}/dev.jsonl"))


def test_skipped_rows_get_a_console_line_with_the_first_line_number(tmp_path, caplog):
    rows = [{"problem": f"p{i}", "answer": str(i)} for i in range(99)]
    rows.insert(41, {"problem": "", "answer": "7"})  # line 42: empty problem
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with caplog.at_level(logging.INFO, logger="scalerl_jax.data.prompts"):
        PromptSource(DataConfig(source=str(path), num_validation=10))
    (line,) = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert line == (
        f"{path}: 1 of 100 rows skipped as malformed (empty 'problem': 1); "
        f"the first at {path}:42 (empty 'problem')"
    )
    caplog.clear()
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(json.dumps(r) for r in rows if r["problem"]) + "\n")
    with caplog.at_level(logging.INFO, logger="scalerl_jax.data.prompts"):
        PromptSource(DataConfig(source=str(good), num_validation=10))
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]
