"""Tokenizers behind one small interface.

:class:`ByteTokenizer` serves the built-in models: one token per UTF-8 byte
plus three specials, so any text round-trips. :class:`HFTokenizer` wraps a
Hugging Face tokenizer loaded from a local model directory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE_OFFSET = 3
BYTE_VOCAB = 256 + BYTE_OFFSET


class Tokenizer(Protocol):
    eos_ids: frozenset[int]
    suppressed_ids: tuple[int, ...]  # never sampled (padding, begin-of-sequence)

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def piece(self, token: int) -> bytes:
        """One token's bytes (for log-probabilities; a special token gives its name)."""
        ...

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]], continue_final: bool = False) -> list[int]:
        """The prompt for ``messages``; with ``continue_final`` the last (assistant)
        message is left open for the model to continue, with no new turn."""
        ...


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    # OpenAI content parts: keep the text ones
    return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")


# A built-in (random) model writes printable ASCII and newlines only: its output is
# valid UTF-8 and readable. Any UTF-8 text still goes in.
_UNPRINTABLE = tuple(b + BYTE_OFFSET for b in range(256) if not (32 <= b < 127 or b == 10))


class ByteTokenizer:
    """Bytes as tokens.

    The chat template is ``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``.
    """

    eos_ids = frozenset({EOS_ID})
    suppressed_ids = (PAD_ID, BOS_ID, *_UNPRINTABLE)
    vocab_size = BYTE_VOCAB

    def encode(self, text: str) -> list[int]:
        return [BOS_ID, *(b + BYTE_OFFSET for b in text.encode("utf-8"))]

    def decode(self, ids: Sequence[int]) -> str:
        data = bytes(i - BYTE_OFFSET for i in ids if i >= BYTE_OFFSET)
        return data.decode("utf-8", errors="replace")

    def piece(self, token: int) -> bytes:
        if token >= BYTE_OFFSET:
            return bytes([token - BYTE_OFFSET])
        return {PAD_ID: b"<pad>", BOS_ID: b"<bos>", EOS_ID: b"<eos>"}.get(token, b"")

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]], continue_final: bool = False) -> list[int]:
        turns = [f"<|{m.get('role', 'user')}|>\n{_content(m)}\n" for m in messages]
        if continue_final and turns:
            return self.encode("".join(turns)[:-1])  # the last turn stays open
        return self.encode("".join(turns) + "<|assistant|>\n")


class HFTokenizer:
    """A ``transformers`` tokenizer; chat prompts use its chat template when it has one."""

    def __init__(self, tok: Any) -> None:
        self._tok = tok
        eos = tok.eos_token_id
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self.suppressed_ids: tuple[int, ...] = ()
        # where a text of no tokens starts (an empty prompt): the model's begin-of-sequence
        # token, else its first end-of-sequence one (a document boundary), as an OpenAI
        # model starts an empty prompt from its <|endoftext|>
        bos = tok.bos_token_id
        self._start = [bos] if isinstance(bos, int) else sorted(self.eos_ids)[:1]
        # a byte-level BPE's tokens are bytes written as characters (GPT-2's table: " " as
        # "Ġ"): read back, a token that is part of a character gives its own bytes
        self._bytes = _BYTE_OF if _byte_level(tok) else None

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True)) or list(self._start)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def piece(self, token: int) -> bytes:
        table = self._bytes
        if table is not None and token not in self._tok.all_special_ids:
            name = self._tok.convert_ids_to_tokens(token)
            if isinstance(name, str) and name and all(c in table for c in name):
                return bytes(table[c] for c in name)
        return str(self._tok.decode([token], skip_special_tokens=False)).encode("utf-8")

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]], continue_final: bool = False) -> list[int]:
        plain = [{"role": m.get("role", "user"), "content": _content(m)} for m in messages]
        if getattr(self._tok, "chat_template", None):
            out = self._tok.apply_chat_template(
                plain,
                add_generation_prompt=not continue_final,
                continue_final_message=continue_final,
                tokenize=True,
            )
            ids = out["input_ids"] if isinstance(out, Mapping) else out
            return [int(i) for i in ids]
        text = "".join(f"{m['role']}: {m['content']}\n" for m in plain)
        return self.encode(text[:-1] if continue_final and text else text + "assistant:")


def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is written as in a byte-level
    BPE's tokens, read backwards (printable Latin-1 as itself, the rest from U+0100 on)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(kept)
    n = 0
    for b in range(256):
        if b not in kept:
            kept.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(kept, chars, strict=True)}


_BYTE_OF = _gpt2_bytes()


def _byte_level(tok: Any) -> bool:
    """Whether ``tok`` is a byte-level BPE (a space is part of the next token, as "Ġ")."""
    try:
        names = tok.convert_ids_to_tokens(tok.encode(" a", add_special_tokens=False))
    except Exception:  # (a tokenizer that cannot say: its pieces are decoded)
        return False
    return bool(names) and isinstance(names[0], str) and names[0].startswith("\u0120")
