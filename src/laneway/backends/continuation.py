"""The requests an upstream worker sends: a job made in code, and a preempted job resumed.

By token ids (exact): the engine gave the prompt's token ids and each
generated token's id (vLLM and SGLang: ``return_token_ids``, then
``prompt_token_ids`` and ``token_ids``), so the rest is asked of
``/completions`` with the ids so far as the prompt, for chat requests too:
nothing is tokenized again. Its chunks are turned back into chat chunks for
a chat request (``text`` -> ``delta.content``, completions log-probabilities
-> chat ones).

By text (the fallback for engines that give no ids): the text so far is
appended to the prompt (completions), or sent as a last assistant message to
continue (chat, ``continue_final_message``). Exact only where the engine
tokenizes prompt + text as it generated it (true of byte-level tokenizers,
not always of BPE ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laneway.generation import CHAT, COMPLETION, Job

# chat-only fields, and what a continuation must not repeat (echo, prompt log-probabilities)
NOT_CONTINUED = frozenset(
    {
        "messages",
        "prompt",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "parallel_tool_calls",
        "response_format",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "documents",
        "mm_processor_kwargs",
        "echo",
        "prompt_logprobs",
        "max_completion_tokens",
        "max_tokens",
        "min_tokens",
        "logprobs",
        "top_logprobs",
        "n",
        "best_of",
        "suffix",
        "include_reasoning",
        "reasoning_effort",
        "modalities",
        "audio",
        "prediction",
        "web_search_options",
        "store",
        "metadata",
    }
)


def remaining(body: Mapping[str, Any], kind: str, done: int) -> dict[str, Any]:
    """The size fields of a continuation after ``done`` tokens (none where the client gave none)."""
    out: dict[str, Any] = {}
    limit = body.get("max_completion_tokens") if kind == CHAT else None
    if limit is None:
        limit = body.get("max_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool):
        out["max_tokens"] = max(limit - done, 1)
    least = body.get("min_tokens")
    if isinstance(least, int) and not isinstance(least, bool) and least - done > 0:
        out["min_tokens"] = least - done
    return out


def by_ids(body: Mapping[str, Any], kind: str, ids: list[int], done: int) -> dict[str, Any]:
    """The ``/completions`` body that continues a request from ``ids`` (prompt + generated)."""
    out = {k: v for k, v in body.items() if k not in NOT_CONTINUED}
    out.update(remaining(body, kind, done))
    out["prompt"] = ids
    logprobs = body.get("logprobs")
    if kind == CHAT:
        if logprobs is True:
            top = body.get("top_logprobs")
            out["logprobs"] = top if isinstance(top, int) and not isinstance(top, bool) else 0
    elif logprobs is not None:
        out["logprobs"] = logprobs
    return out


def by_text(body: Mapping[str, Any], kind: str, text: str, done: int) -> dict[str, Any]:
    """The body that continues a request from its text so far (same endpoint)."""
    out = {k: v for k, v in body.items() if k not in ("max_tokens", "max_completion_tokens", "min_tokens")}
    out.update(remaining(body, kind, done))
    if kind == CHAT:
        out["messages"] = [*body.get("messages", ()), {"role": "assistant", "content": text}]
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    else:
        out["prompt"] = body.get("prompt", "") + text
        out.pop("echo", None)
    return out


def chat_logprobs(lp: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Completions log-probabilities (``tokens``, ``token_logprobs``, ``top_logprobs``) as chat ones."""
    if not lp:
        return None
    tokens = lp.get("tokens") or []
    values = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    content = []
    for i, token in enumerate(tokens):
        top = tops[i] if i < len(tops) and tops[i] else {}
        content.append(
            {
                "token": token,
                "logprob": values[i] if i < len(values) else None,
                "bytes": list(token.encode("utf-8")),
                "top_logprobs": [
                    {"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))} for t, v in top.items()
                ],
            }
        )
    return {"content": content}


def as_chat_chunk(chunk: dict[str, Any]) -> dict[str, Any]:
    """A ``/completions`` chunk of a continued chat request, as a chat chunk."""
    out = {k: v for k, v in chunk.items() if k != "choices"}
    out["object"] = "chat.completion.chunk"
    choices = []
    for c in chunk.get("choices") or ():
        # (a chat chunk has no prompt ids in its choices: those of a continuation are not shown)
        choice = {k: v for k, v in c.items() if k not in ("text", "logprobs", "prompt_token_ids")}
        text = c.get("text")
        choice["delta"] = {"content": text} if text else {}
        choice["logprobs"] = chat_logprobs(c.get("logprobs"))
        choice["finish_reason"] = choice.pop("finish_reason", None)
        choices.append({"index": choice.pop("index", 0), **choice})
    out["choices"] = choices
    return out


def request_body(job: Job) -> dict[str, Any]:
    """The OpenAI request a job made in code stands for (its sampling parameters, as given)."""
    p = job.params
    body: dict[str, Any] = {"temperature": p.temperature, "top_p": p.top_p}
    if p.max_tokens is not None:
        body["max_tokens"] = p.max_tokens
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    if p.ignore_eos:
        body["ignore_eos"] = True
    if job.kind == CHAT:
        body["messages"] = [dict(m) for m in job.messages or ()]
        if job.continue_final:
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    elif job.kind == COMPLETION:
        body["prompt"] = job.prompt
    return body
