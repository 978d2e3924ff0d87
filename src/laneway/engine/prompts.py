"""A request's prompt as a model of the in-process engine sees it: its token ids, checked
against the model's vocabulary and context before a slot is taken."""

from __future__ import annotations

from laneway.engine.models import LoadedModel
from laneway.errors import ContextTooLong, InvalidRequest
from laneway.generation import Job


def tokenize(model: LoadedModel, job: Job) -> list[int]:
    """``job``'s prompt as this model sees it: its token ids (checked), its text encoded,
    or its chat messages through the model's chat template."""
    tok = model.tokenizer
    if isinstance(job.prompt, list):  # token ids, as given
        vocab = int(model.config.vocab_size)
        if not job.prompt or not all(isinstance(t, int) and 0 <= t < vocab for t in job.prompt):
            raise InvalidRequest(f"prompt token ids must be in 0–{vocab - 1}", param="prompt")
        ids = list(job.prompt)
    elif job.prompt is not None:
        ids = tok.encode(job.prompt)
    else:
        ids = tok.chat_prompt(job.messages or (), job.continue_final)
    if not ids:  # (a tokenizer of no special token to start from)
        raise InvalidRequest(f"the prompt encodes to no token for model {model.name}", param="prompt")
    return ids


def prompt_ids(model: LoadedModel, job: Job) -> list[int]:
    """Tokenize ``job``'s prompt; raise :class:`ContextTooLong` if it cannot fit."""
    ids = tokenize(model, job)
    _check_ids(model, job)
    context = model.context
    if len(ids) >= context:
        raise ContextTooLong(
            f"the prompt is {len(ids)} tokens; model {model.name} takes at most {context - 1} prompt tokens",
            param="messages" if job.messages is not None else "prompt",
        )
    wanted = len(ids) + (job.params.max_tokens or 0)
    given = job.params.max_tokens_from
    if wanted > context and given is not None:  # (a default is lowered: add())
        raise ContextTooLong(
            f"model {model.name}'s context is {context} tokens; this request asks for {wanted} "
            f"({len(ids)} in the prompt, {given} {job.params.max_tokens}): lower {given} "
            f"to at most {context - len(ids)}",
            param=given,
        )
    return ids


def _check_ids(model: LoadedModel, job: Job) -> None:
    """Token ids the request names (``logit_bias``, ``stop_token_ids``) are the model's."""
    vocab = int(model.config.vocab_size)
    for name, ids in (
        ("logit_bias", [t for t, _ in job.params.logit_bias]),
        ("stop_token_ids", job.params.stop_token_ids),
    ):
        past = [t for t in ids if not 0 <= t < vocab]
        if past:
            raise InvalidRequest(
                f"{name}: token id {past[0]} is not in model {model.name}'s vocabulary (0–{vocab - 1})",
                param=name,
            )
