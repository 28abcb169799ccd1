"""One tokenizer interface over HF `tokenizer.json` (via `tokenizers`) and SentencePiece `.model`.

`load_tokenizer(path)` reads a checkpoint directory (or the file itself). Chat templates come from
`tokenizer_config.json` (`chat_template`, a string or a list of named templates) or a
`chat_template.jinja` file, and are rendered by jinja2 in a sandbox: templates ship with
downloaded checkpoints, so they must not reach Python internals. A SentencePiece model without a
template gets `DEFAULT_CHAT_TEMPLATE`.

`encode` adds no special tokens by default: chat templates already write BOS / role markers, and
adding them again is the classic double-BOS bug. Special tokens written as text (`<|im_end|>`,
`<s>`) are encoded as their single ids by both backends.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
from typing import Any, Optional, Sequence

from scalerl_jax.errors import UserError

DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


class TokenizerError(UserError, ValueError):
    """A tokenizer file is missing or malformed, or a chat template failed."""


class _HFBackend:
    def __init__(self, file: str):
        from tokenizers import Tokenizer as HFTokenizer

        self.tok = HFTokenizer.from_file(file)
        self.special = {
            t.content: i for i, t in self.tok.get_added_tokens_decoder().items() if t.special
        }

    def default_specials(self) -> dict:
        return {}  # tokenizer.json does not say which token is eos: tokenizer_config.json does

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self.tok.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)


class _SPBackend:
    def __init__(self, file: str):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=file)
        n = self.sp.get_piece_size()
        self.special = {self.sp.id_to_piece(i): i for i in range(n) if self.sp.is_control(i)}
        # SentencePiece does not parse control pieces written as text; split them out first.
        self._split = (
            re.compile(
                "(" + "|".join(map(re.escape, sorted(self.special, key=len, reverse=True))) + ")"
            )
            if self.special
            else None
        )

    def default_specials(self) -> dict:
        ids = {
            "bos_token": self.sp.bos_id(),
            "eos_token": self.sp.eos_id(),
            "pad_token": self.sp.pad_id(),
        }
        return {k: self.sp.id_to_piece(i) for k, i in ids.items() if i >= 0}

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = [self.sp.bos_id()] if add_special_tokens and self.sp.bos_id() >= 0 else []
        for part in self._split.split(text) if self._split else [text]:
            if part in self.special:
                ids.append(self.special[part])
            elif part:
                ids += self.sp.encode(part)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        out: list[str] = []
        run: list[int] = []
        for i in map(int, ids):
            if self.sp.is_control(i):
                out.append(self.sp.decode(run))
                run = []
                if not skip_special_tokens:
                    out.append(self.sp.id_to_piece(i))
            else:
                run.append(i)
        out.append(self.sp.decode(run))
        return "".join(out)

    def token_to_id(self, token: str) -> Optional[int]:
        i = self.sp.piece_to_id(token)
        return None if i == self.sp.unk_id() and token != self.sp.id_to_piece(i) else i

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()


def _token_text(value) -> Optional[str]:
    # tokenizer_config stores special tokens as strings or as serialised AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value


def _render_env():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TokenizerError(f"chat template error: {message}")

    def tojson(x, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


class Tokenizer:
    """encode / decode / special ids / chat template, whichever file format is underneath."""

    def __init__(
        self,
        backend,
        config: Optional[dict] = None,
        chat_template: Optional[str] = None,
        extra_eos_ids: Sequence[int] = (),
    ):
        self._b = backend
        config = config or {}
        self.chat_template = chat_template
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.pad_token = _token_text(config.get("pad_token"))
        for field, tok in backend.default_specials().items():
            if getattr(self, field) is None:
                setattr(self, field, tok)
        for field in ("bos_token", "eos_token", "pad_token"):
            tok = getattr(self, field)
            if tok is not None and self.token_to_id(tok) is None:
                raise TokenizerError(f"{field}={tok!r} is not in the vocabulary")
        self._extra_eos = tuple(int(i) for i in extra_eos_ids)
        self._template: Any = None  # a jinja2 Template, compiled on first use

    # -- ids -----------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._b.vocab_size

    @property
    def bos_id(self) -> Optional[int]:
        return None if self.bos_token is None else self.token_to_id(self.bos_token)

    @property
    def eos_id(self) -> Optional[int]:
        return None if self.eos_token is None else self.token_to_id(self.eos_token)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends a generation: eos plus `generation_config.json`'s eos ids (Llama-3
        instruct models stop on several)."""
        ids = ([self.eos_id] if self.eos_id is not None else []) + list(self._extra_eos)
        return tuple(dict.fromkeys(ids))

    @property
    def pad_id(self) -> int:
        """The pad token's id; models without one pad with eos (then 0): padded positions are
        masked out anyway, so any valid id works."""
        for tok in (self.pad_token, self.eos_token):
            if tok is not None:
                # __init__ refused pad and eos tokens that are not in the vocabulary.
                return self.token_to_id(tok)  # type: ignore[return-value]
        return 0

    def token_to_id(self, token: str) -> Optional[int]:
        return self._b.token_to_id(token)

    # -- text ----------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._b.encode(text, add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._b.decode([int(i) for i in ids], skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[dict], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render `messages` ([{"role", "content"}, ...]) to the prompt string. Extra keyword
        arguments reach the template (e.g. `enable_thinking=False` for Qwen3)."""
        if self._template is None:
            if not self.chat_template:
                raise TokenizerError("this tokenizer has no chat template")
            self._template = _render_env().from_string(self.chat_template)
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            pad_token=self.pad_token or "",
            **kwargs,
        )


# -- loading ------------------------------------------------------------------------------------
def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _chat_template(directory: str, config: dict) -> Optional[str]:
    jinja = os.path.join(directory, "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja) as f:
            return f.read()
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default", next(iter(named.values()), None))
    return template


# What a checkpoint directory needs beside its weights for the tokenizer, its chat template and
# its stop ids to load as they did from the source checkpoint.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
)


def copy_tokenizer_files(source: Optional[str], dest: str) -> None:
    """Copy the TOKENIZER_FILES that `source` (an HF directory, or None) has into `dest`."""
    if not source:
        return
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), dest)


def load_tokenizer(path) -> Tokenizer:
    """A `Tokenizer` from a checkpoint directory (tokenizer.json, else tokenizer.model / one
    *.model) or from one of those files directly."""
    path = os.fspath(path)
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    if os.path.isdir(path):
        candidates = [os.path.join(path, "tokenizer.json"), os.path.join(path, "tokenizer.model")]
        candidates += sorted(
            os.path.join(path, f) for f in os.listdir(path) if f.endswith(".model")
        )
        file = next((c for c in candidates if os.path.exists(c)), None)
        if file is None:
            raise TokenizerError(f"no tokenizer.json or *.model (SentencePiece) in {path}")
    elif os.path.exists(path):
        file = path
    else:
        raise TokenizerError(f"tokenizer path {path} does not exist")
    backend: _HFBackend | _SPBackend
    if file.endswith(".json"):
        backend = _HFBackend(file)
    elif file.endswith(".model"):
        backend = _SPBackend(file)
    else:
        raise TokenizerError(f"{file}: expected a tokenizer.json or a SentencePiece .model")
    config = _read_json(os.path.join(directory, "tokenizer_config.json"))
    template = _chat_template(directory, config)
    if template is None and isinstance(backend, _SPBackend):
        template = DEFAULT_CHAT_TEMPLATE
    gen_eos = _read_json(os.path.join(directory, "generation_config.json")).get("eos_token_id")
    extra = gen_eos if isinstance(gen_eos, list) else ([gen_eos] if gen_eos is not None else [])
    return Tokenizer(backend, config, template, extra)
