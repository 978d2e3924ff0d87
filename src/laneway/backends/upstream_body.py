"""What an upstream run sends, and what its engine is learnt to take.

A run's body is the client's (less laneway's own fields), with the worker's extra fields
(``x_*``), the upstream's name for the model (or the LoRA adapter the job names), always
streamed with usage, its class as vLLM's ``priority`` where the worker forwards it, and —
where the engine gives them (``token_ids = "vllm"``) — the token ids asked for. A run
resumed after a preemption continues from its token ids or its text
(:mod:`laneway.backends.continuation`).

What the engine takes is learnt, not assumed (:class:`~laneway.backends.capabilities.Capabilities`):
a 400 to a field laneway added tells it refuses it, a run that ends well that it takes.
"""

from __future__ import annotations

import logging
from typing import Any

from laneway.backends.capabilities import Capabilities
from laneway.backends.continuation import by_ids, by_text
from laneway.backends.upstream_run import Run, UpstreamUnavailable
from laneway.generation import CHAT, COMPLETION, EMBEDDING, RESPONSES, Job, ResumeMethod, ResumeRule

log = logging.getLogger("laneway.backends")

PATHS = {CHAT: "chat/completions", COMPLETION: "completions", EMBEDDING: "embeddings", RESPONSES: "responses"}


class Bodies:
    """The bodies of one upstream worker's runs."""

    def __init__(
        self, name: str, model: str, *, token_ids: str, options: dict[str, Any], forward_priority: bool
    ) -> None:
        self.name = name
        self.model = model
        self.token_ids = token_ids
        self.options = options  # extra body fields sent with every request
        self.forward_priority = forward_priority
        self.adapters: frozenset[str] = frozenset()  # LoRA adapters a job may name as its model
        self.caps = Capabilities()  # what the engine takes, as learnt

    def model_of(self, job: Job) -> str:
        """The upstream's name for the model ``job`` asks for."""
        return job.model if job.model in self.adapters else self.model

    def relayed(self, job: Job) -> dict[str, Any]:
        """The body of a request sent to the upstream's own endpoint of its kind (the
        Responses API): as the client sent it, streamed."""
        body: dict[str, Any] = {**self.options, **(job.body or {})}
        body["model"] = self.model_of(job)
        body["stream"] = True
        if self.forward_priority:
            body["priority"] = job.rank
        return body

    def of(self, run: Run) -> tuple[str, dict[str, Any]]:
        """This run's endpoint and body."""
        job = run.job
        body: dict[str, Any] = {**self.options, **(job.body or {})}
        kind = job.kind
        run.continued = run.runs > 0 and (run.tokens > 0 or run.out_ids is not None)
        model = self.model_of(job)
        if kind == EMBEDDING:
            body["model"] = model
            if self.forward_priority:  # (vLLM's embedding requests take it too)
                body["priority"] = job.rank
            return PATHS[kind], body
        via = kind
        run.by = ""
        if run.continued:
            if run.out_ids is not None and run.prompt_ids is not None and self.caps.id_prompts is not False:
                body = by_ids(body, kind, run.prompt_ids + run.out_ids, len(run.out_ids))
                via, run.by = COMPLETION, "ids"
            else:
                body = by_text(body, kind, run.text, run.tokens)
                run.by = "text"
        body["model"] = model
        body["stream"] = True
        if self.forward_priority:  # (vLLM: lower runs first; laneway's P0 is 0)
            body["priority"] = job.rank
        options = job.body.get("stream_options") if job.body else None
        body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        run.added_ids = False
        # (with echo, vLLM would blank the prompt)
        if (
            self.asks_ids
            and not run.without_ids
            and not body.get("echo")
            and not body.get("return_token_ids")
        ):
            body["return_token_ids"] = True
            run.added_ids = True
        run.via = via
        return PATHS[via], body

    def resume_method(self, job: Job) -> ResumeMethod:
        """How a preemption of ``job`` would resume, as far as what the engine takes is known."""
        if job.resume is ResumeRule.NONE:
            return ResumeMethod.NONE
        if job.resume is ResumeRule.RESTART:
            return ResumeMethod.RESTART
        if self.asks_ids and self.caps.id_prompts is not False:
            return ResumeMethod.TOKEN_IDS
        if job.kind == CHAT and self.caps.continue_final is False:
            return ResumeMethod.RESTART if not job.stream else ResumeMethod.NONE
        return ResumeMethod.TEXT

    @property
    def asks_ids(self) -> bool:
        """Whether token ids are asked of the engine (configured, and not refused by it)."""
        return self.token_ids == "vllm" and self.caps.token_ids is not False

    def refused(self, run: Run, status: int) -> bool:
        """A 400 to a run that used an extension the engine was not known to take: the
        engine refuses it. Learnt, and ``True`` when the run may be sent again without it."""
        if status not in (400, 422):
            return False
        caps = self.caps
        self.saw_ids(run)
        if run.added_ids and caps.token_ids is None:  # sent again without: that tells
            run.without_ids = True
            return True
        if run.by == "ids" and caps.id_prompts is None:
            caps.id_prompts = False
            log.warning("upstream %s refuses prompts of token ids: requests resume by text", self.name)
            return True
        if run.by == "text" and run.job.kind == CHAT and caps.continue_final is None:
            caps.continue_final = False
            log.warning(
                "upstream %s refuses continue_final_message: a chat request stopped there starts again "
                "if its client has seen nothing yet, and one being streamed is not stopped",
                self.name,
            )
            if run.assembly is not None:  # the client has seen nothing: from scratch, exactly
                run.reset()
                return True
            raise UpstreamUnavailable(
                f"upstream {self.name} cannot continue a chat request it was stopped in "
                "(it refuses continue_final_message)",
                worker_fault=False,
            )
        return False

    def saw_ids(self, run: Run) -> None:
        """Ids came in an earlier run of this job: the engine gives them."""
        if self.caps.token_ids is None and run.out_ids is not None and (run.added_ids or run.by == "ids"):
            self.caps.token_ids = True

    def learnt(self, run: Run) -> None:
        """A run ended well: what it used is taken."""
        caps = self.caps
        self.saw_ids(run)
        if run.without_ids and caps.token_ids is None:  # refused with them, taken without
            caps.token_ids = False
            log.warning("upstream %s refuses return_token_ids: requests resume by text there", self.name)
        if run.added_ids and caps.token_ids is None:
            caps.token_ids = run.out_ids is not None  # (ignored: no ids came)
        if run.by == "ids":
            caps.id_prompts = True
        elif run.by == "text" and run.job.kind == CHAT:
            caps.continue_final = True
