"""Turning generated ids into text that is safe to stream.

Text is decoded from all ids each time (tokenizers merge across tokens), a
trailing incomplete UTF-8 sequence is held back, and so is any tail that could
still become a stop string. A stop string ends the text just before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from laneway.engine.tokenizer import Tokenizer


class TextState:
    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str], emitted: int = 0) -> None:
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""
        self.emitted = emitted  # characters of text already streamed
        self.stopped = False

    def update(self, ids: Sequence[int]) -> str:
        """Decode ``ids`` (all generated so far); return the new safe text."""
        text = self._tok.decode(ids)
        if self._stop:
            start = max(0, self.emitted - self._hold - 1)  # streamed text never holds a stop
            cut = min((i for s in self._stop if (i := text.find(s, start)) >= 0), default=-1)
            if cut >= 0:
                self.text = text[:cut]
                self.stopped = True
                return self.flush()
        self.text = text
        end = len(text)
        while end > self.emitted and text[end - 1] == "\ufffd":
            end -= 1  # maybe an incomplete multi-byte character: not text yet
        safe = end - self._hold  # (the tail that could still begin a stop string, of the text itself)
        if safe <= self.emitted:
            return ""
        out = text[self.emitted : safe]
        self.emitted = safe
        return out

    def restore(self, ids: Sequence[int]) -> None:
        """The text of a resumed job (no stop string in it, or it would have
        ended); ``emitted`` keeps what was already streamed."""
        self.text = self._tok.decode(ids)

    def flush(self) -> str:
        """The rest of the text, at the end of the job."""
        out = self.text[self.emitted :]
        self.emitted = len(self.text)
        return out
