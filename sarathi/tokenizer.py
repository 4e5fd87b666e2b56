"""Tokenizer, chat template and incremental detokenization (Hugging Face tokenizers underneath)."""

from __future__ import annotations

import codecs
import functools
import os
import re
from dataclasses import dataclass, field

# Context tokens from the prompt so the first output tokens decode with the right leading space.
_DETOKENIZE_CONTEXT = 5


class Tokenizer:
    """Encodes prompts, applies the model's chat template and decodes token ids.

    Loads ``tokenizer.json`` / ``tokenizer_config.json`` from a local folder; never touches a hub.
    """

    def __init__(self, folder: str) -> None:
        if not os.path.isfile(os.path.join(folder, "tokenizer.json")) and not os.path.isfile(
            os.path.join(folder, "tokenizer.model")
        ):
            raise FileNotFoundError(f"no tokenizer.json in model folder {folder}")
        from transformers import AutoTokenizer  # local_files_only: no hub, without setting the process's env

        self._tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.folder = folder

    @staticmethod
    def preload() -> None:
        """Import the tokenizer library now (about 2 s in a fresh process, most of a server's start-up
        besides the engine core's): a thread can do it while the engine core starts elsewhere."""
        from transformers import AutoTokenizer  # noqa: F401

    @property
    def eos_token_id(self) -> int | None:
        return self._tok.eos_token_id

    @property
    def chat_template(self) -> str | None:
        """The chat template's source (None if the tokenizer has none)."""
        template = self._tok.chat_template
        return template if isinstance(template, str) or template is None else str(template)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a plain-text prompt (with the tokenizer's own BOS handling unless told not to)."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def token_strs(self, token_ids: list[int]) -> list[str]:
        """The vocabulary entries of these ids (byte-level pieces as the tokenizer spells them)."""
        return [str(t) for t in self._tok.convert_ids_to_tokens(token_ids)]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (a token may hold part of a UTF-8 character)."""
        piece = self._tok.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        byte_token = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)  # SentencePiece byte fallback
        if byte_token:
            return bytes([int(byte_token.group(1), 16)])
        decoder = _byte_decoder()
        if self._byte_level and all(c in decoder for c in piece):
            return bytes(decoder[c] for c in piece)
        return self.decode([token_id], skip_special_tokens=False).encode()

    @functools.cached_property
    def decode_bytes(self) -> list[bytes] | None:
        """Each id's bytes in ``decode(ids, skip_special_tokens=True)``, when that decode is the plain
        concatenation of per-token bytes read as UTF-8 (a byte-level BPE decoder, no clean-up of spaces):
        then text can be extended a token at a time without calling the tokenizer. None otherwise."""
        if not self._byte_level or getattr(self._tok, "clean_up_tokenization_spaces", False):
            return None
        decoder = _byte_decoder()
        special = set(self._tok.all_special_ids)
        table = []
        for i, piece in enumerate(self._tok.convert_ids_to_tokens(list(range(len(self._tok))))):
            if i in special or piece is None:
                table.append(b"")
            elif all(c in decoder for c in piece):  # what the byte-level decoder does, token by token
                table.append(bytes(decoder[c] for c in piece))
            else:  # e.g. an added token with characters outside the byte alphabet: written as is
                table.append(piece.encode())
        return table

    @functools.cached_property
    def token_texts(self) -> list[str]:
        """Each id's text on its own, ``decode([id], skip_special_tokens=False)``: what log probabilities
        show for a token and its alternatives, built once instead of a decode call per entry."""
        # A loop of single decodes: measured 3-4x faster than batch_decode of one-token lists.
        return [self._tok.decode([i], skip_special_tokens=False) for i in range(len(self._tok))]

    @functools.cached_property
    def _byte_level(self) -> bool:
        backend = getattr(self._tok, "backend_tokenizer", None)
        return type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, add_special_tokens: bool = False
    ) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template."""
        if not self._tok.chat_template:
            raise ValueError(f"the tokenizer in {self.folder} has no chat template")
        _check_messages(messages)
        text = self._tok.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        # The template already writes any BOS token, so by default special tokens are not added again.
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """Inverse of the byte-level BPE alphabet: printable bytes stand for themselves, the rest are shifted
    to code points from 256 up."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping, shift = {}, 0
    for b in range(256):
        if b in printable:
            mapping[chr(b)] = b
        else:
            mapping[chr(256 + shift)] = b
            shift += 1
    return mapping


def _check_messages(messages: list[dict]) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}")


@dataclass
class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas.

    Byte-level tokenizers (``Tokenizer.decode_bytes``): appends each token's bytes to an incremental UTF-8
    decoder, which holds back an incomplete character. Others: decodes a small window of recent tokens each
    step instead of the whole output, and holds back text while the window ends in an incomplete UTF-8
    character (decoded as U+FFFD).
    """

    tokenizer: Tokenizer
    prompt_tail: list[int]
    ids: list[int] = field(default_factory=list)
    text: str = ""
    _prefix: int = 0
    _read: int = 0

    def __post_init__(self) -> None:
        self._bytes = self.tokenizer.decode_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace") if self._bytes is not None else None
        self.ids = list(self.prompt_tail[-_DETOKENIZE_CONTEXT:])
        self._prefix = 0
        self._read = len(self.ids)

    def add(self, token_ids: list[int]) -> str:
        """Append tokens and return the newly completed text (possibly empty)."""
        if self._bytes is not None:
            table = self._bytes
            delta = self._utf8.decode(b"".join([table[t] if 0 <= t < len(table) else b"" for t in token_ids]))
            self.text += delta
            return delta
        self.ids.extend(token_ids)
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read])
        full_text = self.tokenizer.decode(self.ids[self._prefix :])
        if full_text.endswith("\ufffd") or len(full_text) <= len(prefix_text):
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta
