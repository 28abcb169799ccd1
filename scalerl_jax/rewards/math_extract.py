"""The final answer of a math completion (`extract_answer`).

From the most explicit statement of an answer to the least: thinking stripped and cut at the
first chat-template token; the last \\boxed (with the boxes joined to it by separators); an
"answer is" phrase; the last math span of the last line; a stand-alone final number. Deny by
default: an answer followed by an alternative, a hedge or words is no answer. Hand-written
because math-verify's extraction is too lenient for a reward; every scan is linear. The rules:
docs/rewards.md, "Math answers".
"""

from __future__ import annotations

import re
from typing import Optional

MAX_COMPLETION_CHARS = 400_000  # ~100k tokens: longer than any generation we sample
MAX_PHRASE_CHARS = 400  # an answer sentence longer than this is not read for its value
MAX_GAP_CHARS = 200  # text between two boxes that state one answer
MAX_JOINED_BOXES = 65  # more is no answer (math_limits.MAX_ELEMENTS refuses it): stop scanning
MAX_BOX_DEPTH = 8  # boxes inside a box, flattened
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
UNIT_WORDS = (
    r"(?:sq(?:uare)?\.?\s*|cubic\s*)?(?:cm|mm|km|meters?|metres?|inch(?:es)?|feet|foot"
    r"|ft|yards?|miles?|units?|degrees?|dollars?|cents?|hours?|hrs?|minutes?|mins?"
    r"|seconds?|secs?|days?|weeks?|months?|years?|grams?|kg|mg|pounds?|lbs?|mph|kmh"
    r"|liters?|litres?|ml|people|students|ways|points?|times|m/s|km/h|yuan|euros?)"
)


def strip_thinking(
    text: str, require_close: bool = False, open_tag: str = THINK_OPEN, close_tag: str = THINK_CLOSE
) -> Optional[str]:
    """The text after the last `close_tag`; None when thinking was opened but never closed (an
    unfinished thought has no final answer); the whole text when there is no thinking.
    `require_close=True` is for templates whose prompt already opens the thinking block."""
    end = text.rfind(close_tag)
    if end >= 0:
        return text[end + len(close_tag) :]
    return None if require_close or open_tag in text else text


_TURN_TOKEN_RE = re.compile(r"<\|[a-z_]{1,20}\|>")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*")
NO_BOX = object()


def braced(text: str, start: int) -> Optional[tuple[str, int]]:
    """Content of the balanced `{...}` opening at `start`, and the index after it."""
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : j], j + 1
    return None


def _box_at(text: str, m: re.Match) -> Optional[tuple[str, int]]:
    """(content, end) of the box whose command `m` matched; None when unbalanced or empty."""
    i = m.end()
    if i < len(text) and text[i] == "{":
        return braced(text, i)
    token = re.match(r"[^\s$]+", text[i:])  # "\boxed 5"
    return (token.group(0), i + token.end()) if token else None


def flatten_boxes(content: str) -> str:
    """A box's content with every box inside it replaced by its own content: `\\boxed{x =
    \\boxed{5}}` is `x = 5`, and `\\boxed{3 \\text{ or } \\boxed{4}}` keeps its "3 or" (an inner
    box never hides the text around it). An unbalanced inner box stays as written (and the
    comparison cannot read it)."""
    for _ in range(MAX_BOX_DEPTH):
        m = _BOX_RE.search(content)
        got = _box_at(content, m) if m else None
        if m is None or got is None:
            return content
        content = content[: m.start()] + got[0] + content[got[1] :]
    return content


def _boxes(text: str):
    """[(start, end, content)] of the top-level boxes; content None for a box left open (a
    truncated one swallows the rest of the text). Each character is scanned once."""
    out: list[tuple[int, int, Optional[str]]] = []
    i = 0
    while True:
        m = _BOX_RE.search(text, i)
        if m is None:
            return out
        got = _box_at(text, m)
        if got is None:
            out.append((m.start(), len(text), None))
            return out
        out.append((m.start(), got[1], flatten_boxes(got[0])))
        i = got[1]


def last_boxed(text: str):
    """Content of the last \\boxed{...} / \\fbox{...} (boxes inside it flattened); None when
    the last box is unbalanced; `NO_BOX` when there is none."""
    boxes = _boxes(text)
    return boxes[-1][2] if boxes else NO_BOX


# What may stand between two boxes that state one answer: separators, spacing, math delimiters,
# "and" / "or", and a label "y_2 =" just before the next box.
_JOINER = (
    r"(?:\s|[,;.&$~]|\\[()\[\],;: !]|\\\\|\\q?quad(?![a-zA-Z])|\\text\{[\s,;]*(?:and|or)?"
    r"[\s,;]*\}|\b(?:and|or)\b)*"
)
_LABEL = r"(?P<label>[a-zA-Z](?:_\{?\w{1,4}\}?)?)\s*=\s*\$?\s*"
_GAP_RE = re.compile(_JOINER + r"(?:" + _LABEL + r")?")
# A short phrase ending in "and" also joins: "\boxed{1} papers and \boxed{2} bins".
_TEXT_RE = re.compile(r"\\text\{([^{}]*)\}")
_WORDY_GAP_RE = re.compile(r"[^\d\\{}=]{0,40}\b(?:and|or)\s*(?:\$|\\\(|\\\[)?\s*")


def _final_boxes(text: str):
    """(answer, end of the last box) for the last group of joined boxes; (None, end) when the
    last box is unbalanced or empty; NO_BOX when there is no box."""
    boxes = _boxes(text)
    if not boxes:
        return NO_BOX
    _, end, content = boxes[-1]
    if content is None or not content.strip():
        return None, end
    items = [content.strip()]  # last box first
    k = len(boxes) - 1
    while k > 0 and len(items) <= MAX_JOINED_BOXES:
        gap = text[boxes[k - 1][1] : boxes[k][0]]
        if len(gap) > MAX_GAP_CHARS:
            break
        m = _GAP_RE.fullmatch(gap)
        if m is None and not _WORDY_GAP_RE.fullmatch(_TEXT_RE.sub(r" \1 ", gap)):
            break
        if m is not None and m.group("label"):  # "y_2 = \boxed{...}": keep the name
            items[-1] = f"{m.group('label')} = {items[-1]}"
        previous = boxes[k - 1][2]
        if previous is None or not previous.strip():
            break
        items.append(previous.strip())
        k -= 1
    if len(items) > 1:
        label = re.search(_LABEL + r"$", text[max(0, boxes[k][0] - 12) : boxes[k][0]])
        if label:
            items[-1] = f"{label.group('label')} = {items[-1]}"
    return ", ".join(reversed(items)), end


# What may follow a final answer in its sentence (deny by default: any other word, e.g. "or 6",
# "approximately", "is wrong", makes the answer unreadable): punctuation, spacing, closing math
# delimiters, degrees, %, one unit (the units `math_normalize` drops), "is the answer".
_CLOSING = r"""(?:\s|[.!*$,;:%"]|°|\\"|\\[)\],;!%]|\\q?quad(?![a-zA-Z])|\^\s*\{?\\circ\}?)*"""
_UNIT_TAIL = (
    r"(?:\\(?:text|mathrm|mbox)\{\s*" + UNIT_WORDS + r"\s*\}|" + UNIT_WORDS + r"(?![a-zA-Z])"
    r"|[a-zA-Z]{1,2}[²³]|[€£]|percent(?:age)?(?![a-zA-Z])|pct(?![a-zA-Z]))"
    r"(?:\^\{?[23]\}?|[²³])?"
)
_DONE = (
    r"(?:(?:which\s+|this\s+)?(?:is|are)\s+(?:the|our)\s+(?:final\s+)?(?:answer|solution"
    r"|result)s?|in\s+total|altogether|ago)(?![a-zA-Z])"
)
_TAIL_RE = re.compile(
    _CLOSING + r"(?:" + _UNIT_TAIL + _CLOSING + r")?(?:" + _DONE + _CLOSING + r")?"
)


# What may not follow a box in its sentence: an alternative, a hedge, a verdict on it, a
# relation or an operation that continues it.
_BOX_QUALIFIER_RE = re.compile(
    r"(?:\s|\$|\\[)\]]|\\text\{|\*|\()*(?:(?:or|not|nor|either|approx\w*|about|around|maybe"
    r"|perhaps|possibly|probably|roughly|nearly|almost|at\s+(?:least|most)|was|were|isn\W?t"
    r"|(?:is|are)(?!\s+(?:the|our|my)\s+(?:final\s+|correct\s+)?(?:answer|solution|result)s?\b)"
    r"|seems?|but|if|unless|except|plus|minus|times|and\s*\$?\s*[-\d\\])(?![a-zA-Z])"
    r"|[=<>+\-*/^_!?±≈≤≥≠|]|\\(?:approx|pm|mp|le|ge|leq|geq|ne|neq|neg|lt|gt|sim|cdot|times"
    r"|div|to|implies|Rightarrow|rightarrow|not|boxed|fbox|lor|vee)(?![a-zA-Z])|\d)",
    re.IGNORECASE,
)


def ends_answer(rest: str) -> bool:
    """Whether `rest`, the text after an answer, adds nothing to it up to the end of its
    sentence (a new sentence or line may say anything)."""
    sentence = re.split(r"(?<=[.!?])\s|\n", rest[:MAX_PHRASE_CHARS], maxsplit=1)[0]
    return len(sentence) < MAX_PHRASE_CHARS and _TAIL_RE.fullmatch(sentence) is not None


def final_boxed(text: str):
    """The answer a worked solution boxes: its last group of joined boxes (`\\boxed{2} and
    \\boxed{3}` is `2, 3`); None when that box is unbalanced or empty; NO_BOX without one."""
    got = _final_boxes(text)
    return got if got is NO_BOX else got[0]


_ANSWER_RE = re.compile(r"(?:final\s+)?answer\s*(?:is|:)\s*:?", re.IGNORECASE)
_HEDGE_WORDS_RE = re.compile(
    r"\b(?:or|not|either|maybe|perhaps|approximately|about|around"
    r"|roughly|nearly|between)\b",
    re.IGNORECASE,
)
_ALTERNATIVES_BEFORE_RE = re.compile(
    r"\b(?:or|either|maybe|perhaps|approximately|about|around|roughly|nearly|almost|between"
    r"|probably|possibly)\b",
    re.IGNORECASE,
)
_WORD_RE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")
_LAST_VERB_RE = re.compile(r".*(?:\b(?:is|are|equals|was|be)\b|=)", re.DOTALL)
_SPANS_RE = re.compile(r"\$+([^$]+)\$+((?:\s*(?:,|and|or)\s*\$+[^$]+\$+)*)")


def _answer_phrase(text: str) -> Optional[tuple[str, int]]:
    """(the text after the last "answer is" / "Answer:", its position)."""
    m = None
    for m in _ANSWER_RE.finditer(text):  # noqa: B007 - the last match is kept
        pass
    if m is None:
        return None
    rest = text[m.end() :].strip().lstrip("*").strip()
    rest = re.sub(r'^\\?"', "", rest)  # quoted: "$12$ and $13$"
    dollars = _SPANS_RE.match(rest[:MAX_PHRASE_CHARS])
    if dollars and ends_answer(rest[dollars.end() :]):  # "$12$ and $13$": the spans, joined
        return (dollars.group(1) if not dollars.group(2) else dollars.group(0)).strip(), m.start()
    rest = rest.split("\n", 1)[0]
    rest = re.split(r"\.(?:\s|$)", rest, maxsplit=1)[0]
    rest = rest.strip().strip("*").strip()
    return (_in_sentence(rest), m.start()) if rest else None


def _in_sentence(phrase: str) -> str:
    """The answer a sentence states ("The volume of $ABCD$ is 120" -> 120): the value after its
    last "is" / "=" when that is one number or math span, else its only number; the phrase
    itself when it is no sentence, has no number, or hedges ("3 or 4", "about 5")."""
    if len(phrase) > MAX_PHRASE_CHARS:
        return phrase  # no answer is this long (math.within_limits refuses it)
    outside_math = re.sub(r"\$[^$]*\$|\\\(.*?\\\)|\\text\{[^{}]*\}", " ", phrase)
    if not _WORD_RE.search(outside_math) or not re.search(r"\d|\$", phrase):
        return phrase
    if _HEDGE_WORDS_RE.search(outside_math):
        return phrase
    verb = _LAST_VERB_RE.match(phrase)
    if verb:
        tail = phrase[verb.end() :].strip()
        span = re.fullmatch(r"\$([^$]+)\$[.!]?", tail)
        if span:
            return span.group(1).strip()
        number = standalone_number(tail)
        if number is not None and len(_LAST_NUMBER_RE.findall(tail)) == 1:
            return number
    if len(_LAST_NUMBER_RE.findall(phrase)) == 1 and "$" not in phrase:
        return standalone_number(phrase) or phrase
    return phrase


# What may follow the answer's math span on its line: "is the answer", "is our solution".
_SPAN_TAIL_RE = re.compile(
    r"\s(?:is|are)\s+(?:the|our)\s+(?:final\s+)?"
    r"(?:answer|solution|result)s?$"
)
_CLOSERS = (("$$", "$$"), ("$", "$"), ("\\)", "\\("), ("\\]", "\\["))


def _last_line_math(text: str) -> Optional[str]:
    """The last math span of the last non-empty line when only punctuation (or "is the answer")
    follows it: "... so the solution set is $\\{1, 2\\}$." Found from the closing delimiter at
    the end and the nearest opening one before it: linear, where a span pattern would rescan
    the line from every opening delimiter."""
    line = next((ln for ln in reversed(text.split("\n")) if ln.strip()), None)
    if line is None:
        return None
    body = line.rstrip(" .!*")
    window = max(0, len(body) - 60)  # the tail is short: search only the end of the line
    tail = _SPAN_TAIL_RE.search(body, window)
    if tail:
        body = body[: tail.start()].rstrip(" .!*")
    for close, open_ in _CLOSERS:
        if body.endswith(close) and not (close == "$" and body.endswith("\\$")):
            start = body.rfind(open_, 0, len(body) - len(close))
            if start < 0:
                return None
            return body[start + len(open_) : len(body) - len(close)].strip() or None
    return None


_LAST_NUMBER_RE = re.compile(
    r"(?:(?<![\w)\]}])-)?(?:\\[dt]?frac\{\d+\}\{\d+\}|\d{1,3}(?:,\d{3})+(?:\.\d+)?"
    r"|\d{1,3}(?: \d{3})+(?![\d.,])|\d+,\d\d(?!\d|,\d)|\d*\.?\d+(?:/\d+)?)(?:\s*\\?%)?"
)
# Text allowed right after a stand-alone final number: units, degrees, closing math delimiters.
_NUMBER_TAIL_RE = re.compile(
    r"(?:\^\s*\{?\\circ\}?|\\(?:text|mathrm|mbox|,|;|quad|\)|\]|\$)"
    r"(?![a-zA-Z]))"
)
_RELATION_BEFORE_RE = re.compile(r"\\(?:geq?|leq?|gt|lt|neq?|pm|mp|approx)$")


def _strip_markup(s: str, end: bool) -> str:
    """`s` without spaces, `$` and markdown bold at its end (`end`) or start; a single `*` is
    multiplication and stays."""
    for _ in range(3):
        s = s.rstrip(" $") if end else s.lstrip(" $")
        if s.endswith("**") if end else s.startswith("**"):
            s = s[:-2] if end else s[2:]
    return s


def standalone_number(text: str) -> Optional[str]:
    """The last number of `text` when it is a whole answer, not a piece of an expression."""
    m = None
    for m in _LAST_NUMBER_RE.finditer(text):  # noqa: B007 - the last match is kept
        pass
    if m is None:
        return None
    before, after = text[: m.start()], text[m.end() :]
    if before and (before[-1].isalpha() or before[-1] == "\\"):
        return None  # x2, \sqrt5
    prev = _strip_markup(before, end=True)
    if prev and prev[-1] in "^_{([,+-*/\\|<>!&":
        return None
    if _RELATION_BEFORE_RE.search(prev):
        return None  # "x \geq 5" is not 5
    if after[:1].isalpha() and not re.match(r"[a-zA-Z]{1,2}[²³]", after):
        return None  # 5x (but 5m², a unit)
    rest = _strip_markup(after, end=False)
    tail = _NUMBER_TAIL_RE.match(rest)
    if rest and not tail and rest[0] in "^_}])(+-*/,=<>!&\\|[{":
        return None
    if not ends_answer(after):
        return None  # "5 or 6", "5 approximately", "1,250 pears": words that hedge or qualify
    sentence = re.split(r"[.!?]\s|\n\s*\n", before[-MAX_PHRASE_CHARS:])[-1]
    if _ALTERNATIVES_BEFORE_RE.search(sentence):
        return None  # "I think 5 or 6", "between 5 and 6", "maybe 6" (but "not 10, it's 12")
    return m.group(0).strip()


def extract_answer(completion: str, require_close: bool = False) -> Optional[str]:
    """The final answer of a completion, or None (order: see the module docstring)."""
    if len(completion) > MAX_COMPLETION_CHARS:
        return None
    text = strip_thinking(completion, require_close)
    if text is None:
        return None
    turn = _TURN_TOKEN_RE.search(text)
    if turn:
        text = text[: turn.start()]
    phrase = _answer_phrase(text)
    boxed = _final_boxes(text)
    if boxed is not NO_BOX:
        answer, end = boxed
        later = phrase is not None and phrase[1] >= end and re.search(r"\d", phrase[0])
        if later:
            return phrase[0]  # type: ignore[index]  # later: phrase is set
        # "\\boxed{5} or 6", "\\boxed{5} is wrong": the box is not the whole answer (a box
        # delimits its answer, so other words after it, "\\boxed{2} distinct values", are prose)
        return None if _BOX_QUALIFIER_RE.match(text, end) else answer
    if phrase:
        return phrase[0]
    return _last_line_math(text) or standalone_number(text)
