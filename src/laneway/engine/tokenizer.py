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

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True)) or list(self._start)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def piece(self, token: int) -> bytes:
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
