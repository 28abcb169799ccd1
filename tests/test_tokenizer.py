"""Tokenizer interface over a tiny trained BPE (tokenizer.json) and a tiny SentencePiece model."""

import json

import pytest

from scalerl_jax.models.tokenizer import DEFAULT_CHAT_TEMPLATE, TokenizerError, load_tokenizer

TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "What is two plus two? The answer is four.",
    "Let me think step by step about this problem.",
    "Okay, time is up. Let me stop thinking and formulate a final answer now.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 and symbols + - * / = ( ).",
] * 20

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        TEXT,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    d = tmp_path_factory.mktemp("bpe")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": {"content": "<|im_end|>", "special": True},
                "pad_token": "<|endoftext|>",
                "bos_token": None,
                "chat_template": CHATML,
            }
        )
    )
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return d


@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory):
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("sp")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT),
        model_prefix=str(d / "tokenizer"),
        vocab_size=400,
        model_type="bpe",
        hard_vocab_limit=False,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        unk_id=0,
        # Llama-2 style: no normalisation, bytes for unseen characters (e.g. the newline)
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        byte_fallback=True,
        minloglevel=2,
    )
    return d


def test_bpe_round_trip_and_special_ids(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    text = "What is two plus two? Let me think."
    ids = tok.encode(text)
    assert ids and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.eos_id == tok.token_to_id("<|im_end|>") == 2
    assert tok.pad_id == tok.token_to_id("<|endoftext|>") == 0
    assert tok.bos_id is None
    assert tok.eos_ids == (2, 0)  # eos first, then generation_config's, no duplicates
    assert tok.vocab_size == len(tok._b.tok.get_vocab())


def test_bpe_chat_template_renders_and_specials_encode_as_single_ids(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    prompt = tok.apply_chat_template(messages)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert not tok.apply_chat_template(messages, add_generation_prompt=False).endswith(
        "assistant\n"
    )
    ids = tok.encode(prompt)
    start = tok.token_to_id("<|im_start|>")
    assert ids.count(start) == 3 and ids.count(tok.eos_id) == 2
    assert tok.decode(ids) == prompt
    assert "<|im_start|>" not in tok.decode(ids, skip_special_tokens=True)


def test_chat_template_from_jinja_file_and_list_form(bpe_dir, tmp_path):
    for f in ("tokenizer.json",):
        (tmp_path / f).write_text((bpe_dir / f).read_text())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "<|im_end|>",
                "chat_template": [
                    {"name": "tool_use", "template": "TOOLS"},
                    {"name": "default", "template": "D{{ messages|length }}"},
                ],
            }
        )
    )
    assert load_tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "D1"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages[0]['content']|tojson }}")
    tok = load_tokenizer(tmp_path / "tokenizer.json")
    assert tok.apply_chat_template([{"role": "user", "content": "é"}]) == 'J"é"'


def test_chat_template_is_sandboxed_and_errors_are_clear(bpe_dir, tmp_path):
    from jinja2.exceptions import SecurityError

    (tmp_path / "tokenizer.json").write_text((bpe_dir / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ ''.__class__.__mro__[1].__subclasses__() }}"})
    )
    with pytest.raises(SecurityError):
        load_tokenizer(tmp_path).apply_chat_template([])
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ raise_exception('only user turns') }}"})
    )
    with pytest.raises(TokenizerError, match="only user turns"):
        load_tokenizer(tmp_path).apply_chat_template([])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(TokenizerError, match="eos_token='<nope>'"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    with pytest.raises(TokenizerError, match="no chat template"):
        load_tokenizer(tmp_path / "tokenizer.json").apply_chat_template([])


def test_sentencepiece_round_trip_specials_and_default_template(sp_dir):
    tok = load_tokenizer(sp_dir)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 3)
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    assert tok.chat_template == DEFAULT_CHAT_TEMPLATE
    text = "The answer is four."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode(text, add_special_tokens=True) == [1] + ids
    prompt = tok.apply_chat_template([{"role": "user", "content": "two plus two?"}])
    assert prompt == "<s>user: two plus two?\nassistant:"
    ids = tok.encode(prompt)
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1  # "<s>" text -> one id
    assert tok.decode(ids) == prompt
    assert tok.decode(ids, skip_special_tokens=True) == prompt[len("<s>") :]
    assert tok.token_to_id("</s>") == 2 and tok.token_to_id("<definitely-not-a-piece>") is None


@pytest.mark.fast
def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.model")
