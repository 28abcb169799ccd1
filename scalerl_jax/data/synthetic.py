"""Synthetic tasks and a character-level tokenizer for the CPU testbed.

The tasks are chosen so a transformer of a few hundred K to a few M parameters with a ~50-symbol
vocabulary can improve on them by RL within minutes on a CPU, and so correctness is an exact
string (verified by rewards/synthetic.verify_exact after the thinking block):

  addition    "12+34="        -> "46"     knobs: min_digits, max_digits
  arithmetic  "52-17="        -> "35"     + and -, never negative; knobs: min_digits, max_digits
  reverse     "reverse:abc="  -> "cba"    knobs: min_len, max_len, alphabet
  count       "count a:abca=" -> "2"      knobs: min_len, max_len, alphabet

The model is expected to answer "<think>...</think>46"; `<think>` and `</think>` are single tokens
of the CharTokenizer so the sampler can force `</think>` (interruptions) in one step.
Generators are deterministic given the seed (Python's `random.Random`, whose integer streams are
stable across versions) and return distinct problems: asking for more rows than the task's
problem space holds is an error naming both numbers.
"""
from __future__ import annotations

import random
from typing import NamedTuple, Optional, Sequence


class SyntheticRow(NamedTuple):
    prompt_id: str
    prompt: str
    answer: str


def _number(rng: random.Random, min_digits: int, max_digits: int) -> int:
    digits = rng.randint(min_digits, max_digits)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)


def _addition(rng, min_digits: int = 1, max_digits: int = 3):
    a, b = _number(rng, min_digits, max_digits), _number(rng, min_digits, max_digits)
    return f"{a}+{b}=", str(a + b)


def _arithmetic(rng, min_digits: int = 1, max_digits: int = 3):
    a, b = _number(rng, min_digits, max_digits), _number(rng, min_digits, max_digits)
    if rng.random() < 0.5:
        return f"{a}+{b}=", str(a + b)
    a, b = max(a, b), min(a, b)
    return f"{a}-{b}=", str(a - b)


def _word(rng, min_len: int, max_len: int, alphabet: str) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(min_len, max_len)))


def _reverse(rng, min_len: int = 3, max_len: int = 8, alphabet: str = "abcdefgh"):
    word = _word(rng, min_len, max_len, alphabet)
    return f"reverse:{word}=", word[::-1]


def _count(rng, min_len: int = 4, max_len: int = 10, alphabet: str = "abcd"):
    word = _word(rng, min_len, max_len, alphabet)
    letter = rng.choice(alphabet)
    return f"count {letter}:{word}=", str(word.count(letter))


_TASKS = {"addition": _addition, "arithmetic": _arithmetic, "reverse": _reverse, "count": _count}
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
            raise ValueError(f"synthetic:{task} with {knobs or 'default knobs'} yielded only "
                             f"{len(rows)} distinct problems in {attempts - 1} draws; asked for "
                             f"{num}: widen the difficulty knobs or ask for fewer")
        try:
            prompt, answer = make(rng, **knobs)
        except (TypeError, ValueError) as e:  # unknown knob name, or min > max
            raise ValueError(f"synthetic:{task}: bad knobs {knobs}: {e}") from None
        rows.setdefault(prompt, SyntheticRow(f"{task}/{prompt}", prompt, answer))
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
                    raise ValueError(f"CharTokenizer: character {text[i]!r} at position {i} of "
                                     f"{text[:40]!r} is not in the vocabulary")
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

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            **kwargs) -> str:
        """The fixed template; keyword arguments (e.g. enable_thinking) are accepted and unused."""
        prefixes = {"system": "", "user": "q:", "assistant": "a:"}
        parts = []
        for m in messages:
            role = m.get("role")
            if role not in prefixes:
                raise ValueError(f"CharTokenizer.apply_chat_template: role {role!r} not in "
                                 f"{tuple(prefixes)}")
            parts.append(prefixes[role] + m["content"] + "\n")
        if add_generation_prompt:
            parts.append("a:")
        return "".join(parts)
