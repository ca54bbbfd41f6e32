"""Text in and out: a checkpoint's own tokenizer (``tokenizer.json``, read by the ``tokenizers``
library: the optional extra ``pip install -e '.[text]' in a clone``).

:func:`load_tokenizer` opens it; :class:`TextTokenizer` encodes and decodes; :func:`text_prompt` turns
a text into a prompt of token ids, repeating the text to reach a requested length (benchmarks
prefill long prompts; a short text repeated is still text the model has a tokenizer for). Random
ids stay the default for benchmarks that need no text. Errors are :class:`TokenizerError`, one line.
"""

from __future__ import annotations

from pathlib import Path

import torch

TOKENIZER_FILE = "tokenizer.json"


class TokenizerError(ValueError):
    """No tokenizer for a text prompt (no package, no tokenizer.json, an unreadable one), or a text
    that gives no tokens; the message names the file."""


class TextTokenizer:
    """A loaded ``tokenizers.Tokenizer`` and the file it came from."""

    def __init__(self, tokenizer, path: Path):
        self.tokenizer, self.path = tokenizer, path

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce (special tokens included)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the tokenizer's own post-processing
        (e.g. a BOS token first) applies, as in the model's training."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids, *, skip_special_tokens: bool = True) -> str:
        """The text of token ids (a list or a 1-d tensor)."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def load_tokenizer(model: str | Path) -> TextTokenizer:
    """The tokenizer of the model directory ``model`` (its ``tokenizer.json``)."""
    path = Path(model)
    if not path.is_dir():
        raise TokenizerError(f"{model}: a text prompt needs a model directory with {TOKENIZER_FILE}; {model!s} is "
                             f"not one (the built-in models have random weights and no tokenizer)")
    file = path / TOKENIZER_FILE
    if not file.is_file():
        raise TokenizerError(f"{path}: has no {TOKENIZER_FILE}, which a text prompt needs (the checkpoint's own "
                             f"tokenizer); without a prompt file the prompt is random token ids")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerError(f"{file}: text prompts need the 'tokenizers' package: pip install -e '.[text]' in a clone of vpp "
                             f"(or pip install tokenizers)") from None
    try:
        return TextTokenizer(Tokenizer.from_file(str(file)), file)
    except Exception as exc:  # tokenizers raises its own Exception subclass for a bad file
        raise TokenizerError(f"{file}: cannot be read by the tokenizers library ({str(exc).splitlines()[0][:200]})") \
            from None


def text_prompt(tokenizer: TextTokenizer, text: str, seq_len: int | None = None, *,
                vocab_size: int | None = None) -> torch.Tensor:
    """Token ids (int64) of ``text``: with special tokens as the tokenizer adds them; with
    ``seq_len`` the text is repeated (without further special tokens) and the ids cut to exactly
    ``seq_len``. With ``vocab_size`` (the model's), ids outside the model's vocabulary are refused."""
    ids = tokenizer.encode(text)
    if seq_len is not None:
        if seq_len < 1:
            raise TokenizerError(f"seq_len={seq_len} must be >= 1")
        body = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) < seq_len and not body:
            raise TokenizerError(f"{tokenizer.path}: the prompt text gives no tokens to repeat up to {seq_len}")
        while len(ids) < seq_len:
            ids += body
        ids = ids[:seq_len]
    if not ids:
        raise TokenizerError(f"{tokenizer.path}: the prompt text gives no tokens")
    if vocab_size is not None and max(ids) >= vocab_size:
        raise TokenizerError(f"{tokenizer.path}: gives token id {max(ids)}, outside the model's vocab_size={vocab_size}")
    return torch.tensor(ids, dtype=torch.long)


def prompt_ids(model: str | Path, vocab_size: int, seq_len: int | None, prompt_file: str | Path | None = None, *,
               seed: int = 0, default_len: int = 4096) -> torch.Tensor:
    """The prompt of a run: the text of ``prompt_file`` in ``model``'s tokenizer (repeated up to
    ``seq_len`` when given), or else ``seq_len`` (default ``default_len``) random ids from ``seed``."""
    if prompt_file is None:
        n = seq_len or default_len
        return torch.randint(0, vocab_size, (n,), generator=torch.Generator().manual_seed(seed))
    try:
        text = Path(prompt_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{prompt_file}: cannot be read as a text prompt ({type(exc).__name__}: {exc})") from None
    if not text.strip():  # a tokenizer would still give its BOS: a one-token prompt nobody asked for
        raise TokenizerError(f"{prompt_file}: the prompt file is empty ({len(text)} characters, no text)")
    return text_prompt(load_tokenizer(model), text, seq_len, vocab_size=vocab_size)


__all__ = ["TOKENIZER_FILE", "TextTokenizer", "TokenizerError", "load_tokenizer", "prompt_ids", "text_prompt"]
