"""The routing bench's workload: agents with system prompts of their own, and a batch flood
(``bench/routing_bench.py``)."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

MODEL = "smollm2"


def engine_parser(doc: str) -> argparse.ArgumentParser:
    """A bench's parser (``doc``: its module's), with the vLLM venv and model it starts."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--vllm", required=True, metavar="VENV")
    ap.add_argument("--model", required=True, metavar="DIR")
    return ap


WORDS = (  # the words the system prompts are made of
    "the of and to in is you that it he was for on are as with his they at be this have from or one had "
    "by word but not what all were we when your can said there use an each which she do how their if will "
    "up other about out many then them these so some her would make like him into time has look two more "
    "write go see number no way could people my than first water been call who oil its now find long down "
    "day did get come made may part over new sound take only little work know place year live me back give "
    "most very after thing our just name good sentence man think say great where help through much before "
    "line right too mean old any same tell boy follow came want show also around form three small set put "
    "end does another well large must big even such because turn here why ask went men read need land "
    "different home us move try kind hand picture again change off play spell air away animal house point"
)


def workload(
    agents: int, requests: int, words: int, tokens: int, order: str = "cyclic", seed: int = 0
) -> list[dict[str, Any]]:
    """``requests`` chat bodies, each of an agent with its own system prompt: agent
    ``i % agents`` (``cyclic``), every agent once a round in an order drawn anew for each
    round (``rounds``: agents that each send their next turn once the last is answered), or
    one drawn at random (``random``); seeded."""
    rng = random.Random(seed)
    vocab = WORDS.split()
    systems = system_prompts(agents, words, rng)
    turns: list[int] = []
    while order == "rounds" and len(turns) < requests:
        turns += rng.sample(range(agents), agents)
    out = []
    for i in range(requests):
        if order == "rounds":
            agent = turns[i]
        elif order == "cyclic":
            agent = i % agents
        else:
            agent = rng.randrange(agents)
        out.append(
            {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": systems[agent]},
                    {
                        "role": "user",
                        "content": f"Question {i}: what is {rng.choice(vocab)} {rng.choice(vocab)}?",
                    },
                ],
                "max_tokens": tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
        )
    return out


def system_prompts(agents: int, words: int, rng: random.Random) -> list[str]:
    vocab = WORDS.split()
    return [
        f"You are agent {a}, a helpful assistant. Your notes: "
        + " ".join(rng.choice(vocab) for _ in range(words))
        for a in range(agents)
    ]


def prompt_tokens(model: Path, bodies: list[dict[str, Any]]) -> int:
    """The tokens of the agents' system prompts together, as the engines' tokenizer counts
    them (each prompt once)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    seen = {b["messages"][0]["content"] for b in bodies}
    texts = [tok.apply_chat_template([{"role": "system", "content": s}], tokenize=False) for s in seen]
    return sum(len(tok(t)["input_ids"]) for t in texts)


def flood_bodies(n: int, words: int, tokens: int, seed: int = 1) -> list[dict[str, Any]]:
    """``n`` batch requests, each a document of its own to summarise."""
    rng = random.Random(seed)
    vocab = WORDS.split()
    return [
        {
            "model": MODEL,
            "messages": [
                {
                    "role": "user",
                    "content": f"Summarise document {i}: "
                    + " ".join(rng.choice(vocab) for _ in range(words)),
                }
            ],
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        for i in range(n)
    ]
