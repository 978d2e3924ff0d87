"""Text safe to stream: a tail that could still begin a stop string is held back, and so
is an unfinished multi-byte character — held as what it will be, not as one of the
characters held for the stop string (the beginning of a stop string ending in an emoji
leaked into streams)."""

from __future__ import annotations

from collections.abc import Sequence

from laneway.engine.detok import TextState

# ids -> text as a byte-level tokenizer decodes it: an emoji's first bytes are U+FFFD
TEXTS = {
    (1,): "a",
    (1, 2): "a🎉",
    (1, 2, 3): "a🎉\ufffd",
    (1, 2, 3, 4): "a🎉🎉",
    (1, 2, 3, 4, 5): "a🎉🎉b",
}


class Decoder:
    def decode(self, ids: Sequence[int]) -> str:
        return TEXTS[tuple(ids)]


def streamed(stop: list[str], upto: int) -> tuple[str, str]:
    state = TextState(Decoder(), stop)  # type: ignore[arg-type]
    out = "".join(state.update(list(range(1, n + 1))) for n in range(1, upto + 1))
    return out + state.flush(), state.text


def test_a_stop_string_ending_in_a_multibyte_character_leaks_nothing_of_itself() -> None:
    assert streamed(["🎉🎉"], 4) == ("a", "a")
    assert streamed(["a🎉🎉"], 4) == ("", "")


def test_an_unfinished_character_is_held_and_the_rest_streams() -> None:
    state = TextState(Decoder(), [])  # type: ignore[arg-type]
    assert [state.update(list(range(1, n + 1))) for n in range(1, 6)] == ["a", "🎉", "", "🎉", "b"]
    assert streamed(["zz"], 5) == ("a🎉🎉b", "a🎉🎉b")
