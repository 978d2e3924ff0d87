"""Which request fields laneway owns, which the built-in engines read, and
which values ask for nothing (so an engine that lacks the feature may accept them).

An upstream worker gets every field but :data:`OWNED`. The built-in
engines (the in-process engine, the simulated worker) read the fields of
:data:`READ`; an optional one (:data:`FEATURES`) only where the engine
implements that feature. Any other field is refused with a 400 naming it,
unless its value asks for nothing (:func:`neutral`): a feature is never
dropped silently.
"""

from __future__ import annotations

from typing import Any

from laneway.generation import CHAT, COMPLETION, EMBEDDING

# laneway's own: read here, never forwarded (service_tier picks the class)
OWNED = frozenset({"priority", "preemptible", "laneway", "service_tier"})

READ = {
    CHAT: frozenset(
        {
            "model",
            "messages",
            "stream",
            "stream_options",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "seed",
            "stop",
            "ignore_eos",
            "continue_final_message",
            "add_generation_prompt",
            "user",
            "safety_identifier",
            "prompt_cache_key",
            "metadata",
        }
    ),
    COMPLETION: frozenset(
        {"model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed", "stop"}
        | {"ignore_eos", "user", "metadata"}
    ),
    EMBEDDING: frozenset({"model", "input"}),
}

# optional fields -> the engine feature that serves them
FEATURES = {
    "n": "n",
    "logprobs": "logprobs",
    "top_logprobs": "logprobs",
    "presence_penalty": "penalties",
    "frequency_penalty": "penalties",
    "repetition_penalty": "penalties",
    "top_k": "top_k",
    "min_p": "min_p",
    "logit_bias": "logit_bias",
    "min_tokens": "min_tokens",
    "stop_token_ids": "stop_token_ids",
    "return_token_ids": "token_ids",
}

# field -> values that ask for nothing beyond plain generation
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none", "auto"),
    "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
    "store": (False,),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "n": (1,),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "top_k": (0, -1),
    "min_p": (0, 0.0),
    "min_tokens": (0,),
    "stop_token_ids": ([],),
    "logit_bias": ({},),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "include_stop_str_in_output": (False,),
    "return_token_ids": (False,),
    "parallel_tool_calls": (True, False),  # meaningless without tools
}

# vendor fields for structured output (vLLM, SGLang): their grammar state is not resumable
STRUCTURED = frozenset(
    {
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
    }
)


def neutral(name: str, value: Any) -> bool:
    """Whether ``value`` for ``name`` asks for nothing (``None`` never does)."""
    if value is None:
        return True
    allowed = _NEUTRAL.get(name)
    if allowed is None:
        return False
    # by type too: True must not pass for 1, nor 1 for True
    return any(type(value) is type(a) and value == a for a in allowed)
