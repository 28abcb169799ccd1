"""Synthetic tasks and a character-level tokenizer for the CPU testbed.

Tasks on which a transformer of a few hundred K to a few M parameters (~50-symbol vocabulary)
improves by RL within minutes on a CPU, each problem with one exact answer after the thinking
block (`rewards.exact_match`; `pycode`'s is a stdin/stdout test spec, run by the code verifier)
and a worked thought for the SFT warm-up. `<think>` and `</think>` are single tokens of
`CharTokenizer`, so the sampler forces `</think>` in one step. Generators are deterministic in
the seed and return distinct problems. The tasks and their knobs: docs/datasets.md.
"""

from __future__ import annotations

import json
import random
from typing import Callable, NamedTuple, Optional, Sequence


class SyntheticRow(NamedTuple):
    prompt_id: str
    prompt: str
    answer: str  # the reference answer the verifier checks
    thought: str  # the demonstration's thinking section (may be empty)
    demo_answer: str  # the demonstration's own final answer (an estimate can be off)

    @property
    def completion(self) -> str:
        """The demonstration an SFT warm-up trains on (eos is appended by the tokenizer side)."""
        return f"{CharTokenizer.THINK}{self.thought}{CharTokenizer.THINK_CLOSE}{self.demo_answer}"


def _number(rng: random.Random, min_digits: int, max_digits: int) -> int:
    digits = rng.randint(min_digits, max_digits)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def _addition(rng, min_digits: int = 1, max_digits: int = 3):
    a, b = _number(rng, min_digits, max_digits), _number(rng, min_digits, max_digits)
    return f"{a}+{b}=", str(a + b), f"{a}+{b}={a + b}"


def _arithmetic(rng, min_digits: int = 1, max_digits: int = 3):
    a, b = _number(rng, min_digits, max_digits), _number(rng, min_digits, max_digits)
    if rng.random() < 0.5:
        return f"{a}+{b}=", str(a + b), f"{a}+{b}={a + b}"
    a, b = max(a, b), min(a, b)
    return f"{a}-{b}=", str(a - b), f"{a}-{b}={a - b}"


def _chain(rng, min_terms: int = 2, max_terms: int = 5, digits: int = 2):
    if not 2 <= min_terms <= max_terms or digits < 1:
        raise ValueError(
            f"need 2 <= min_terms={min_terms} <= max_terms={max_terms}, digits={digits} >= 1"
        )
    total = _number(rng, 1, digits)
    prompt, steps = str(total), []
    for _ in range(rng.randint(min_terms, max_terms) - 1):
        x = _number(rng, 1, digits)
        # Subtract only what keeps the running sum non-negative: no minus signs in answers.
        op = "-" if x <= total and rng.random() < 0.5 else "+"
        new = total - x if op == "-" else total + x
        prompt += f"{op}{x}"
        steps.append(f"{total}{op}{x}={new}")
        total = new
    return prompt + "=", str(total), ",".join(steps)


def _countup(
    rng,
    max_start: int = 99,
    min_add: int = 2,
    max_add: int = 9,
    direct: float = 0.0,
    direct_hard: Optional[float] = None,
):
    if not 1 <= min_add <= max_add or max_start < 0 or not 0 <= direct <= 1:
        raise ValueError(
            f"need 1 <= min_add={min_add} <= max_add={max_add}, max_start="
            f"{max_start} >= 0, 0 <= direct={direct} <= 1"
        )
    if direct_hard is not None and not (direct < 1 and 0 <= direct_hard < 1):
        raise ValueError(
            f"need direct={direct} < 1 and 0 <= direct_hard={direct_hard} < 1: the "
            "count-on share is interpolated in log space"
        )
    a, b = rng.randint(0, max_start), rng.randint(min_add, max_add)
    # The share that counts on falls log-linearly in b from 1 - direct (b = min_add) to
    # 1 - direct_hard (b = max_add): the warmed-up policy rarely counts on the hard problems,
    # and RL's signal on a problem grows with the chance of sampling a correct count, so the
    # problems switch to counting on one after another rather than all at once.
    memory = direct
    if direct_hard is not None and max_add > min_add:
        hard = (b - min_add) / (max_add - min_add)
        memory = 1 - (1 - direct) * ((1 - direct_hard) / (1 - direct)) ** hard
    # Always drawn, so the problems (and their ids) do not depend on `direct` or `direct_hard`.
    from_memory, guess = rng.random() < memory, a + b + rng.randint(-3, 3)
    if from_memory:  # a quick estimate, right one time in seven
        return f"{a}+{b}=", str(a + b), "", str(max(guess, 0))
    # Each number carries how many are left to count, so stopping is a local decision (at 0)
    # rather than a count of everything written so far.
    thought = ",".join(f"{a + i}:{b - i}" for i in range(1, b + 1))
    return f"{a}+{b}=", str(a + b), thought, str(a + b)


# stdin values every pycode program is run on: zero, small, large and negative numbers, so a
# program that hard-codes one output, or forgets the multiplier, fails. Few, since each run of
# a program costs a process start.
PYCODE_INPUTS = (0, 7, -5, 1000)


def pycode_tests(mul: int, add: int) -> str:
    """The JSON test spec of `code n*MUL+ADD=` (stdin/stdout pairs, rewards/code's format)."""
    return json.dumps(
        {
            "inputs": [f"{n}\n" for n in PYCODE_INPUTS],
            "outputs": [f"{n * mul + add}\n" for n in PYCODE_INPUTS],
        }
    )


def _pycode(rng, max_mul: int = 9, max_add: int = 9999, direct: float = 0.0):
    if max_mul < 1 or max_add < 0 or not 0 <= direct <= 1:
        raise ValueError(
            f"need max_mul={max_mul} >= 1, max_add={max_add} >= 0, 0 <= direct={direct} <= 1"
        )
    mul, add = rng.randint(1, max_mul), rng.randint(0, max_add)
    # Always drawn, so the problems (and their ids) do not depend on `direct`.
    from_memory, guess = rng.random() < direct, add + rng.randint(-3, 3)
    program = "print(int(input())*{}+{})"
    prompt, tests = f"code n*{mul}+{add}=", pycode_tests(mul, add)
    if from_memory:  # a constant recalled roughly, right one time in seven
        return prompt, tests, "", program.format(mul, max(guess, 0))
    return prompt, tests, f"read n,print n*{mul}+{add}", program.format(mul, add)


def _word(rng, min_len: int, max_len: int, alphabet: str) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(min_len, max_len)))


def _reverse(rng, min_len: int = 3, max_len: int = 8, alphabet: str = "abcdefgh"):
    word = _word(rng, min_len, max_len, alphabet)
    return f"reverse:{word}=", word[::-1], ",".join(word[::-1])


def _count(rng, min_len: int = 4, max_len: int = 10, alphabet: str = "abcd"):
    word = _word(rng, min_len, max_len, alphabet)
    letter = rng.choice(alphabet)
    running = [str(word[: i + 1].count(letter)) for i, ch in enumerate(word) if ch == letter]
    return f"count {letter}:{word}=", str(word.count(letter)), ",".join(running) or "0"


_TASKS: dict[str, Callable[..., tuple]] = {
    "addition": _addition,
    "arithmetic": _arithmetic,
    "reverse": _reverse,
    "count": _count,
    "chain": _chain,
    "countup": _countup,
    "pycode": _pycode,
}
TASKS = tuple(_TASKS)


def generate(task: str, num: int, seed: int = 0, **knobs) -> list[SyntheticRow]:
    """`num` distinct problems of `task`, deterministic in (task, num, seed, knobs).
    The prompt id is "task/prompt", stable across runs and readable in logs."""
    if task not in _TASKS:
        raise ValueError(f"synthetic task {task!r} unknown; choose one of {TASKS}")
    if num <= 0:
        raise ValueError(f"synthetic:{task}: num={num} must be > 0")
    make = _TASKS[task]
    rng = random.Random(f"{task}:{seed}")  # str seeds hash with SHA-512: stable across runs
    rows: dict[str, SyntheticRow] = {}
    attempts = 0
    while len(rows) < num:
        attempts += 1
        if attempts > 50 * num + 10_000:
            raise ValueError(
                f"synthetic:{task} with {knobs or 'default knobs'} yielded only "
                f"{len(rows)} distinct problems in {attempts - 1} draws; asked for "
                f"{num}: widen the difficulty knobs or ask for fewer"
            )
        try:
            prompt, answer, thought, *demo = make(rng, **knobs)
        except (TypeError, ValueError) as e:  # unknown knob name, or min > max
            raise ValueError(f"synthetic:{task}: bad knobs {knobs}: {e}") from None
        rows.setdefault(
            prompt,
            SyntheticRow(f"{task}/{prompt}", prompt, answer, thought, demo[0] if demo else answer),
        )
    return list(rows.values())


# ------------------------------------------------------------------------------------ tokenizer
DEFAULT_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz +-*=:,.?()\n"


class CharTokenizer:
    """One id per character, plus <pad>, <eos>, <think> and </think>. No BOS (`bos_id` is None).

    Shares the interface of models/tokenizer.Tokenizer: encode / decode / vocab_size / eos_id /
    eos_ids / pad_id / bos_id / token_to_id / apply_chat_template, with the same defaults
    (decode keeps special tokens unless asked). The chat template is fixed: system text on its
    own line, "q:<user text>" and "a:<assistant text>" lines, and "a:" as the generation prompt.
    The default alphabet is lowercase: a testbed interruption phrase must use these characters
    (e.g. "time is up. </think>"), or pass `chars`.
    """

    THINK, THINK_CLOSE = "<think>", "</think>"

    def __init__(self, chars: str = DEFAULT_CHARS):
        if len(set(chars)) != len(chars):
            raise ValueError(f"CharTokenizer: chars {chars!r} has repeated characters")
        self._tokens = ["<pad>", "<eos>", self.THINK, self.THINK_CLOSE] + list(chars)
        self._ids = {ch: i + 4 for i, ch in enumerate(chars)}
        self.pad_id, self.eos_id, self.bos_id = 0, 1, None
        self.pad_token, self.eos_token, self.bos_token = "<pad>", "<eos>", None
        self.eos_ids = (self.eos_id,)
        self.think_id, self.think_close_id = 2, 3
        self.vocab_size = len(self._tokens)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of `text`; there is no BOS, so `add_special_tokens` changes nothing."""
        ids, i = [], 0
        while i < len(text):
            if text.startswith(self.THINK, i):
                ids.append(self.think_id)
                i += len(self.THINK)
            elif text.startswith(self.THINK_CLOSE, i):
                ids.append(self.think_close_id)
                i += len(self.THINK_CLOSE)
            else:
                token = self._ids.get(text[i])
                if token is None:
                    raise ValueError(
                        f"CharTokenizer: character {text[i]!r} at position {i} of "
                        f"{text[:40]!r} is not in the vocabulary"
                    )
                ids.append(token)
                i += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; `skip_special_tokens=True` drops <pad>/<eos>. The thinking tags always
        decode to their text: they are part of the answer format."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"CharTokenizer: id {i} outside [0, {self.vocab_size})")
            if skip_special_tokens and i in (self.pad_id, self.eos_id):
                continue
            out.append(self._tokens[i])
        return "".join(out)

    def token_to_id(self, token: str) -> Optional[int]:
        return self._tokens.index(token) if token in self._tokens else None

    def apply_chat_template(
        self, messages: Sequence[dict], add_generation_prompt: bool = True, **kwargs
    ) -> str:
        """The fixed template; keyword arguments (e.g. enable_thinking) are accepted and unused."""
        prefixes = {"system": "", "user": "q:", "assistant": "a:"}
        parts = []
        for m in messages:
            role = m.get("role")
            if role not in prefixes:
                raise ValueError(
                    f"CharTokenizer.apply_chat_template: role {role!r} not in {tuple(prefixes)}"
                )
            parts.append(prefixes[role] + m["content"] + "\n")
        if add_generation_prompt:
            parts.append("a:")
        return "".join(parts)
