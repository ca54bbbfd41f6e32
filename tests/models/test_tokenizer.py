"""Text prompts through a checkpoint's own tokenizer.json (a word-level tokenizer written by the
tokenizers library, with a BOS post-processor, as checkpoints ship them), and the errors when there
is no tokenizer to use."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.models.fp8_tiny import WORDS, save_tokenizer
from vpp.models import TokenizerError, load_tokenizer, prompt_ids, text_prompt

TEXT = "the model reads each slice of its weights once"  # 9 words: ids 2.. in WORDS order


@pytest.fixture
def model_dir(tmp_path):
    save_tokenizer(tmp_path)
    return tmp_path


def _ids(text: str) -> list[int]:
    return [WORDS.index(w) + 2 for w in text.split()]


def test_encode_adds_the_bos_once_and_decodes_back(model_dir):
    tok = load_tokenizer(model_dir)
    assert tok.encode(TEXT) == [1] + _ids(TEXT)
    assert tok.encode(TEXT, add_special_tokens=False) == _ids(TEXT)
    assert tok.decode(torch.tensor(tok.encode(TEXT))) == TEXT
    assert tok.decode(tok.encode(TEXT), skip_special_tokens=False) == "<s> " + TEXT
    assert tok.vocab_size == len(WORDS) + 2


def test_text_is_repeated_to_the_requested_length(model_dir):
    tok = load_tokenizer(model_dir)
    assert text_prompt(tok, TEXT).tolist() == [1] + _ids(TEXT)
    long = text_prompt(tok, TEXT, 25)
    assert long.dtype == torch.long and long.tolist() == ([1] + _ids(TEXT) * 3)[:25]
    assert text_prompt(tok, TEXT, 4).tolist() == [1] + _ids(TEXT)[:3]  # cut when the text is longer
    with pytest.raises(TokenizerError, match=r"gives token id 10, outside the model's vocab_size=10"):
        text_prompt(tok, TEXT, vocab_size=10)
    with pytest.raises(TokenizerError, match=r"tokenizer.json: the prompt text gives no tokens to repeat up to 5"):
        text_prompt(tok, "   ", 5)


def test_prompt_ids_is_random_ids_or_the_text(model_dir, tmp_path):
    random = prompt_ids("tiny-deepseek", 96, None, seed=3, default_len=50)
    assert random.shape == (50,) and int(random.max()) < 96
    assert torch.equal(random, prompt_ids("tiny-deepseek", 96, None, seed=3, default_len=50))
    file = tmp_path / "prompt.txt"
    file.write_text(TEXT + "\n")
    assert prompt_ids(model_dir, 96, 12, file).tolist() == ([1] + _ids(TEXT) * 2)[:12]
    with pytest.raises(TokenizerError, match=r"missing.txt: cannot be read as a text prompt \(FileNotFoundError"):
        prompt_ids(model_dir, 96, 12, tmp_path / "missing.txt")


def test_no_tokenizer_is_a_clear_error(model_dir, tmp_path, monkeypatch):
    with pytest.raises(TokenizerError, match=r"tiny-deepseek: a text prompt needs a model directory with "
                                             r"tokenizer.json; tiny-deepseek is not one \(the built-in models"):
        load_tokenizer("tiny-deepseek")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TokenizerError, match=rf"{empty}: has no tokenizer.json, which a text prompt needs"):
        prompt_ids(empty, 96, 8, model_dir / "tokenizer.json")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(TokenizerError, match=rf"{bad / 'tokenizer.json'}: cannot be read by the tokenizers library"):
        load_tokenizer(bad)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # the optional extra is not installed
    with pytest.raises(TokenizerError, match=r"text prompts need the 'tokenizers' package: pip install -e "
                                             r"'\.\[text\]' in a clone of vpp \(or pip install tokenizers\)"):
        load_tokenizer(model_dir)
