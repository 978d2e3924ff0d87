"""A prompt's prefix identity: block hashes shared exactly as far as the prompts are."""

from __future__ import annotations

import os
import subprocess
import sys

from laneway.generation import Job, SamplingParams
from laneway.runtime.prefix import BLOCK_CHARS, BLOCK_IDS, chat_text, of_messages, of_prompt, prefix_of

SYSTEM = "You are a careful reviewer of pull requests. " * 40  # ~1,800 characters


def chat(*messages: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": r, "content": c} for r, c in messages]


def test_two_turns_of_one_agent_share_the_blocks_of_its_system_prompt() -> None:
    one = of_messages(chat(("system", SYSTEM), ("user", "review #1")))
    two = of_messages(chat(("system", SYSTEM), ("user", "review #2, a longer question " * 10)))
    shared = len(chat_text(chat(("system", SYSTEM)))) // BLOCK_CHARS
    assert len(one) == len(chat_text(chat(("system", SYSTEM), ("user", "review #1")))) // BLOCK_CHARS
    assert one[:shared] == two[:shared]
    assert len(two) > shared + 1 and two[shared + 1 :] != one[shared + 1 :]  # (then they part)
    other = of_messages(chat(("system", SYSTEM.replace("careful", "hasty")), ("user", "review #1")))
    assert other[0] != one[0]  # (the first block differs: nothing shared)


def test_what_the_engine_sees_differently_hashes_differently() -> None:
    base = of_messages(chat(("system", SYSTEM), ("user", "hi")))
    assert of_messages(chat(("user", SYSTEM), ("user", "hi")))[0] != base[0]  # the role
    parts = [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
        {"role": "user", "content": "hi"},
    ]
    assert of_messages(parts) == base  # text parts are the text
    assert of_messages(chat(("system", SYSTEM[:100]))) == ()  # under one block: nothing to match


def test_completions_by_text_and_by_token_ids() -> None:
    text = of_prompt("x" * (3 * BLOCK_CHARS + 5))
    assert len(text) == 3 and text[:2] == of_prompt("x" * (2 * BLOCK_CHARS))
    ids = of_prompt(list(range(2 * BLOCK_IDS)))
    assert len(ids) == 2 and ids[0] == of_prompt(list(range(BLOCK_IDS)))[0]
    assert of_prompt(["a", "b"]) == () and of_prompt([1, -2]) == ()  # several prompts; not ids
    job = Job("j", "m", SamplingParams(max_tokens=1), prompt="y" * BLOCK_CHARS)
    assert prefix_of(job) == of_prompt("y" * BLOCK_CHARS)


def test_the_hashes_are_the_same_in_every_process() -> None:
    """A cluster's replicas hash, its leader compares: not Python's per-process hash()."""
    code = "from laneway.runtime.prefix import of_prompt; print(of_prompt('z' * 1000))"
    got = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert got == {f"{of_prompt('z' * 1000)}\n"}
