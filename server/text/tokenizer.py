"""Tokenizer: a checkpoint's fast tokenizer (tokenizer.json) with its special tokens and
chat template."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as FastTokenizer

from argosy.server.exceptions import CheckpointError, InvalidRequestError
from argosy.server.text import chat_template


class Tokenizer:
    def __init__(self, folder: str | Path):
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(path, "file not found (a fast tokenizer, tokenizer.json, is required)")
        try:
            text = path.read_text()
            self._tok = FastTokenizer.from_str(text)
        except Exception as exc:  # the Rust library raises a bare Exception
            raise CheckpointError(path, f"cannot read tokenizer ({exc})") from exc
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.special_tokens = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")}
        self.eos_token_id = self._tok.token_to_id(self.special_tokens["eos_token"] or "")
        self.chat_template = _find_chat_template(folder, config)
        spec = json.loads(text)
        decoder = spec.get("decoder") or {}
        self._byte_level = "ByteLevel" in json.dumps(decoder)
        # Decoding is then the UTF-8 of the tokens' bytes joined, nothing more.
        self.decodes_bytes_only = decoder.get("type") == "ByteLevel"
        # Nothing rewrites the text before it is split: its tokens' bytes add up to its own.
        self._tokens_spell_the_text = self.decodes_bytes_only and spec.get("normalizer") is None
        added = self._tok.get_added_tokens_decoder()
        self._special = {t.content for t in added.values()}
        self.special_ids = frozenset(i for i, t in added.items() if t.special)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates, as JSON's "\ud800" can carry
            raise InvalidRequestError(
                f"the text is not valid Unicode ({exc.reason} at {exc.start})", param="prompt"
            ) from exc
        # The batch call lets go of the GIL while it works (the single one holds it), and without
        # offsets it is faster still: the event loop runs on while a thread tokenizes.
        return self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def fewest_tokens(self, text: str) -> int:
        """A bound the token count of `text` cannot be below, found without tokenizing: each token
        spells at most `longest_token_bytes` of it, and each character is at least a byte. 0
        where a normalizer may rewrite the text first, so that nothing is certain."""
        return len(text) // self.longest_token_bytes if self._tokens_spell_the_text else 0

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        return max(map(len, self.vocab_bytes))

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for, also when they are only part of a character."""
        piece = self._tok.id_to_token(token_id) or ""
        if _BYTE_TOKEN.fullmatch(piece):  # SentencePiece byte fallback: <0xE6>
            return bytes([int(piece[3:5], 16)])
        if self._byte_level and piece not in self._special and all(c in _UNICODE_TO_BYTE for c in piece):
            return bytes(_UNICODE_TO_BYTE[c] for c in piece)
        return self.decode([token_id], skip_special_tokens=False).encode()

    def load_vocab_tables(self) -> None:
        """Builds the tables byte-level detokenization reads (a tenth of a second for 49k tokens)."""
        if self.decodes_bytes_only:
            _ = self.vocab_text, self.longest_token_bytes

    @functools.cached_property
    def vocab_bytes(self) -> list[bytes]:
        """Every token's bytes, by id: what incremental byte-level decoding looks up."""
        return [self.token_bytes(i) for i in range(self._tok.get_vocab_size(with_added_tokens=True))]

    @functools.cached_property
    def vocab_text(self) -> list[str | None]:
        """Every token's text, by id; None where its bytes are not whole characters."""
        return [_whole_text(b) for b in self.vocab_bytes]

    def token_text(self, token_id: int) -> str:
        """A token as text; a partial character is spelled as its bytes, `bytes:\\xe6`, as OpenAI does."""
        raw = self.token_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        template = template or self.chat_template
        if template is None:
            raise InvalidRequestError("this model has no chat template; use a completion prompt", param="messages")
        special = {k: v or "" for k, v in self.special_tokens.items()}
        messages = chat_template.validate_messages(messages)
        return chat_template.render(template, messages, add_generation_prompt, special, tools)


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE spells each byte as a printable character; this maps them back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


_UNICODE_TO_BYTE = _byte_level_alphabet()
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _whole_text(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _token_text(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _find_chat_template(folder: Path, config: dict) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in template}
        return named.get("default") or next(iter(named.values()), None)
    return template
