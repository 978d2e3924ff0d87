"""The in-process inference engine: N slots, batched decode, exact preemption.

:class:`Engine` is single-threaded and synchronous: ``add``/``preempt``/
``resume``/``cancel`` change what runs, ``step()`` runs one round (prefill of
joining sequences, at most :data:`PREFILL_CHUNK` prompt tokens a round, the shortest
first; then one decode step for the whole batch) and emits events through each job's
callback. A long prompt is prefilled over several rounds, so that a step stays short:
a preemption or a cancel (between steps) never waits for a whole long prefill, a short
prompt joining meanwhile is prefilled in the next round, and the running sequences go on
decoding between its chunks. A prompt of a less urgent class (``Job.rank``, which the
runtime sets) is not prefilled while more urgent work runs or joins here: an urgent
request's tokens come at the pace of decode steps, not of a batch prompt's chunks.
:class:`~laneway.engine.runner.EngineRunner` drives it from a thread.

Preemption happens at a token boundary. Mode ``checkpoint`` keeps the
generated ids, the KV cache (host memory, spilled to files past a budget) and
the sampling RNG state: the resumed job computes exactly what it would have.
Mode ``recompute`` keeps ids and RNG state and prefills prompt + generated ids
again: the same text up to floating-point differences between a prefill and
step-by-step decoding (~1e-6 in the logits).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from laneway.engine import prompts
from laneway.engine.checkpoints import CheckpointStore
from laneway.engine.detok import TextState
from laneway.engine.kv_batch import KVBatch, layer_kv
from laneway.engine.models import LoadedModel
from laneway.engine.sampler import adjust, adjusts, logprob_of, new_generator, sample
from laneway.engine.sequences import EngineStats, SavedState, Seq, Sink
from laneway.errors import BackendError, InvalidRequest
from laneway.generation import (
    Checkpoint,
    Delta,
    Done,
    Ending,
    Failed,
    Job,
    ResumeMethod,
    Stopped,
    TokenLogprob,
    Usage,
)

log = logging.getLogger("laneway.engine")
MODES = ("checkpoint", "recompute")
DEFAULT_SPILL_BUDGET = 1 << 30  # bytes of KV checkpoints held in host memory

PREFILL_CHUNK = 512  # prompt tokens prefilled in one round at most (one step: preemptible after it)


def cpu_threads(parameters: int) -> int:
    """Intra-op threads for a CPU engine (process-wide in torch).

    A small model's matrices are too small to split: threads only wait on each
    other (and on a busy machine, ~10× slower). Bigger ones leave a core to
    the event loop.
    """
    if parameters < 5_000_000:
        return 1
    return max(1, (os.cpu_count() or 2) - 1)


class Engine:
    def __init__(
        self,
        model: LoadedModel,
        slots: int = 4,
        *,
        data_dir: Path | None = None,
        spill_budget_bytes: int = DEFAULT_SPILL_BUDGET,
        threads: int | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError("an engine needs at least one slot")
        if model.device.type == "cpu":
            torch.set_num_threads(threads or cpu_threads(model.parameters))
        self.model = model
        self.slots = slots
        self.batch = KVBatch(model.config, model.device)
        self.rows: list[Seq] = []  # row order of the batch
        self.joining: list[Seq] = []
        self.by_id: dict[str, Seq] = {}
        spill = (data_dir or Path(".laneway")) / "checkpoints"
        self.store = CheckpointStore(spill_budget_bytes, spill)
        self.stats = EngineStats()
        vocab = int(model.config.vocab_size)
        self._bias = torch.zeros(vocab, device=model.device)  # -inf on tokens never sampled
        self._bias[[i for i in model.tokenizer.suppressed_ids if i < vocab]] = float("-inf")

    # ------------------------------------------------------------ requests
    @property
    def busy(self) -> int:
        return len(self.by_id)

    @property
    def has_work(self) -> bool:
        return bool(self.by_id)

    def tokenize(self, job: Job) -> list[int]:
        """``job``'s prompt as this model sees it (:func:`laneway.engine.prompts.tokenize`)."""
        return prompts.tokenize(self.model, job)

    def prompt_ids(self, job: Job) -> list[int]:
        """``job``'s prompt ids, checked to fit (:func:`laneway.engine.prompts.prompt_ids`)."""
        return prompts.prompt_ids(self.model, job)

    def add(self, job: Job, sink: Sink, prompt_ids: list[int] | None = None) -> None:
        """Start ``job``; it joins the batch at the next ``step()``."""
        ids = prompt_ids if prompt_ids is not None else self.prompt_ids(job)
        self._check_free(job.id)
        max_new = min(job.params.max_tokens or self.model.context, self.model.context - len(ids))
        text = TextState(self.model.tokenizer, job.params.stop)
        seq = Seq(job, sink, list(ids), len(ids), max_new, new_generator(job.params), text)
        if job.params.logprobs is not None:
            seq.logprobs = []
        self._admit(seq)

    def resume(self, ckpt: Checkpoint, sink: Sink) -> None:
        """Continue a job from its checkpoint; it joins at the next ``step()``."""
        state = ckpt.state
        if not isinstance(state, SavedState) or state.model != self.model.name:
            raise BackendError(
                f"checkpoint of {ckpt.job.id} was not made by an engine running {self.model.name}"
            )
        self._check_free(ckpt.job.id)
        gen = None
        if state.rng is not None:
            gen = torch.Generator(device="cpu")
            gen.set_state(state.rng)
        text = TextState(self.model.tokenizer, ckpt.job.params.stop, emitted=state.emitted)
        seq = Seq(ckpt.job, sink, list(state.ids), state.prompt_len, state.max_new, gen, text)
        seq.logprobs, seq.lp_sent, seq.ids_sent = state.logprobs, state.lp_sent, state.ids_sent
        if state.kv is not None:
            dev = self.model.device
            seq.restored = [(k.to(dev), v.to(dev)) for k, v in self.store.take(state.kv)]
            seq.kv_len = state.kv_len
            state.kv = None
        text.restore(seq.ids[seq.prompt_len :])
        self._admit(seq)

    def _check_free(self, job_id: str) -> None:
        if job_id in self.by_id:
            raise InvalidRequest(f"job {job_id!r} is already running on this engine")
        if len(self.by_id) >= self.slots:
            raise BackendError(f"all {self.slots} slots are busy")

    def _admit(self, seq: Seq) -> None:
        self.by_id[seq.job.id] = seq
        self.joining.append(seq)

    def preempt(self, job_id: str, mode: str = "checkpoint") -> Checkpoint | None:
        """Stop ``job_id`` now (between steps), free its slot and return its checkpoint.

        ``None`` if the job is not here (it already ended). The job's sink also
        gets a :class:`Stopped` event.
        """
        if mode not in MODES:
            raise ValueError(f"unknown preemption mode {mode!r}; expected one of {MODES}")
        seq = self.by_id.pop(job_id, None)
        if seq is None:
            return None
        t0 = time.perf_counter()
        saved, kv_len = None, 0
        if seq.row >= 0:
            if mode == "checkpoint":
                kv = self.batch.row_kv(seq.row, seq.kv_len)
                saved, kv_len = self.store.put(kv), seq.kv_len
            self._drop_rows([seq])
        elif seq.restored is not None and mode == "checkpoint":  # preempted before it rejoined
            saved, kv_len = self.store.put([(k.cpu(), v.cpu()) for k, v in seq.restored]), seq.kv_len
        if seq in self.joining:
            self.joining.remove(seq)
        state = SavedState(
            self.model.name,
            seq.ids,
            seq.prompt_len,
            seq.max_new,
            seq.text.emitted,
            seq.gen.get_state() if seq.gen is not None else None,
            saved,
            kv_len,
            seq.logprobs,
            seq.lp_sent,
            seq.ids_sent,
        )
        nbytes = saved.nbytes if saved is not None else 0
        ckpt = Checkpoint(
            seq.job,
            ResumeMethod(mode),
            seq.generated,
            seq.text.text[: seq.text.emitted],
            nbytes,
            time.perf_counter() - t0,
            state,
        )
        self.stats.preemptions += 1
        self.stats.checkpoint_bytes += nbytes
        seq.sink(Stopped(seq.job.id, ckpt))
        return ckpt

    def discard(self, ckpt: Checkpoint) -> None:
        """Forget a checkpoint that will not be resumed (its request was cancelled)."""
        state = ckpt.state
        if isinstance(state, SavedState) and state.kv is not None:
            self.store.discard(state.kv)
            state.kv = None

    def cancel(self, job_id: str) -> bool:
        """End ``job_id`` now with ``finish_reason="cancelled"``; ``False`` if it is not here."""
        seq = self.by_id.get(job_id)
        if seq is None:
            return False
        self._finish(seq, "cancelled")
        self._drop_rows([seq] if seq.row >= 0 else [])
        return True

    def _fail(self, seqs: list[Seq], exc: Exception) -> None:
        """``seqs`` end with :class:`Failed` (their rows are the caller's to drop)."""
        log.error("engine step failed for %s: %r", ", ".join(s.job.id for s in seqs), exc)
        err = BackendError(f"engine failure: {exc}")
        for seq in seqs:
            if self.by_id.pop(seq.job.id, None) is not None:
                seq.restored = None
                seq.sink(Failed(seq.job.id, err))

    def fail_all(self, exc: Exception) -> None:
        """The engine cannot go on: every job here ends with :class:`Failed`."""
        err = BackendError(f"engine failure: {exc}")
        for seq in list(self.by_id.values()):
            seq.sink(Failed(seq.job.id, err))
        self.by_id.clear()
        self.joining.clear()
        self.rows.clear()
        self.batch = KVBatch(self.model.config, self.model.device)

    # ---------------------------------------------------------------- step
    def step(self) -> None:
        """One round: a round of prefills if sequences are joining (:meth:`_prefill_round`),
        and one decode step unless one of them joined the batch in it.

        Either way every sequence makes at most one token per step.
        """
        if not self.by_id:
            return
        t0 = time.perf_counter()
        with torch.inference_mode():
            # a round of prefills: each sequence done makes its first token
            joined = self._prefill_round() if self.joining else False
            if self.rows and not joined:  # (decodes go on between a long prompt's chunks)
                try:
                    self._decode()
                except Exception as exc:  # the batch's forward pass broke: its requests fail
                    self._fail(list(self.rows), exc)
                    self.rows.clear()
                    self.batch = KVBatch(self.model.config, self.model.device)
        dt = time.perf_counter() - t0
        self.stats.busy_s += dt

    def _prefill_round(self) -> bool:
        """Prefill up to :data:`PREFILL_CHUNK` tokens of the joining sequences of the most
        urgent class here (``Job.rank``: none less urgent while such work runs or joins: its
        steps stay short), those with the fewest left first (a checkpoint's cache joins
        whole, whatever its class); each one done joins the batch and makes its first token,
        the others stay joining. Whether one joined (then no decode this step: a sequence
        makes at most one token a step)."""
        budget = PREFILL_CHUNK
        joined = False
        top = min(s.job.rank for s in (*self.rows, *self.joining))
        for seq in sorted(self.joining, key=self._left):
            if seq.restored is None and (budget <= 0 or seq.job.rank > top):
                continue
            try:
                budget -= self._join(seq, budget)
                joined = joined or seq not in self.joining
            except Exception as exc:  # that request's failure only
                if seq in self.joining:
                    self.joining.remove(seq)
                seq.partial = None
                self._fail([seq], exc)
                if seq in self.rows:
                    self._drop_rows([seq])
        return joined

    @staticmethod
    def _left(seq: Seq) -> int:
        """Prompt tokens ``seq`` has still to prefill (0: a checkpoint's cache, joined whole)."""
        return 0 if seq.restored is not None else len(seq.ids) - seq.kv_len

    def _join(self, seq: Seq, budget: int) -> int:
        """Prefill at most ``budget`` more tokens of ``seq``; once all are, it joins the batch
        (and leaves ``joining``) and makes its first token. How many it prefilled."""
        if seq.restored is not None:
            kv, seq.restored = seq.restored, None
            self.joining.remove(seq)
            seq.row = self.batch.add(kv, seq.kv_len)
            self.rows.append(seq)
            return 0
        # a new job, or a recomputed one: prefill every id, then sample from the last position
        if seq.partial is None:
            seq.partial = DynamicCache(config=self.model.config)
            seq.kv_len = 0
        n = min(len(seq.ids) - seq.kv_len, budget)
        ids = torch.tensor([seq.ids[seq.kv_len : seq.kv_len + n]], device=self.model.device)
        out = self.model.model(input_ids=ids, cache=seq.partial, use_cache=True, logits_to_keep=1)
        self.stats.prefill_tokens += n
        seq.kv_len += n
        if seq.kv_len < len(seq.ids):
            return n  # (more in a later round)
        cache, seq.partial = seq.partial, None
        self.joining.remove(seq)
        seq.row = self.batch.add(layer_kv(cache), seq.kv_len)
        self.rows.append(seq)
        if self._emit(seq, out.logits[0, -1] + self._bias):
            self._drop_rows([seq])
        return n

    def _decode(self) -> None:
        t0 = time.perf_counter()
        rows = self.rows
        inputs = torch.tensor([[s.ids[-1]] for s in rows], device=self.model.device)
        positions = torch.tensor([[s.kv_len] for s in rows], device=self.model.device)
        mask = self.batch.extend_mask()
        out = self.model.model(
            input_ids=inputs,
            attention_mask=mask,
            position_ids=positions,
            cache=self.batch.cache,
            use_cache=True,
        )
        logits = out.logits[:, -1] + self._bias
        ended, failed = [], []
        for i, seq in enumerate(rows):
            seq.kv_len += 1
            try:
                if self._emit(seq, logits[i]):
                    ended.append(seq)
            except Exception as exc:  # sampling this one broke: it fails, the others go on
                failed.append((seq, exc))
        for seq, err in failed:
            self._fail([seq], err)
        self._drop_rows(ended + [seq for seq, _ in failed])
        dt = time.perf_counter() - t0
        st = self.stats
        st.steps += 1
        st.step_s_last = dt
        n, secs = st.by_batch.get(len(rows), (0, 0.0))
        st.by_batch[len(rows)] = (n + 1, secs + dt)

    def _emit(self, seq: Seq, logits: torch.Tensor) -> bool:
        """Sample the next token of ``seq`` and report it; ``True`` when the job ended."""
        params = seq.job.params
        tok = self.model.tokenizer
        row = logits
        early = seq.generated < params.min_tokens  # the text may not end yet
        if early or adjusts(params):
            blocked = (*tok.eos_ids, *params.stop_token_ids) if early else ()
            row = adjust(logits, params, seq.ids[: seq.prompt_len], seq.ids[seq.prompt_len :], blocked)
        token = sample(row, params, seq.gen)
        self.stats.tokens += 1
        if seq.logprobs is not None:
            seq.logprobs.append(logprob_of(logits, token, params.logprobs or 0, tok.piece))
        if token in tok.eos_ids and not params.ignore_eos:
            self._finish(seq, "stop", end=token)
            return True
        seq.ids.append(token)
        text = seq.text.update(seq.ids[seq.prompt_len :])
        if seq.text.stopped or token in params.stop_token_ids:
            self._finish(seq, "stop", last=text)
            return True
        if text:
            self._delta(seq, text)
        if seq.generated >= seq.max_new or seq.kv_len + 1 >= self.model.context:
            self._finish(seq, "length")
            return True
        return False

    def _delta(self, seq: Seq, text: str, end: int | None = None) -> None:
        """Send ``text`` with the log-probabilities and ids not sent yet (``end``: the
        end-of-text id that ended it, an id of the answer that is not in ``seq.ids``)."""
        ids = prompt = None
        if seq.job.params.return_token_ids:
            if seq.ids_sent < 0:
                prompt, seq.ids_sent = tuple(seq.ids[: seq.prompt_len]), 0
            ids = tuple(seq.ids[seq.prompt_len + seq.ids_sent :]) + ((end,) if end is not None else ())
            seq.ids_sent = seq.generated
        seq.sink(
            Delta(
                seq.job.id, text, seq.generated, logprobs=self._unsent(seq), token_ids=ids, prompt_ids=prompt
            )
        )

    def _unsent(self, seq: Seq) -> tuple[TokenLogprob, ...] | None:
        """The log-probabilities not sent with a delta yet (``None``: not asked)."""
        if seq.logprobs is None:
            return None
        out = tuple(seq.logprobs[seq.lp_sent :])
        seq.lp_sent = len(seq.logprobs)
        return out

    def _finish(self, seq: Seq, reason: str, last: str = "", end: int | None = None) -> None:
        self.by_id.pop(seq.job.id, None)
        if seq in self.joining:
            self.joining.remove(seq)
        if seq.restored is not None:
            seq.restored = None
        rest = last + seq.text.flush()
        asked = seq.job.params.return_token_ids
        lp_left = seq.logprobs is not None and seq.lp_sent < len(seq.logprobs)
        if rest or lp_left or (asked and (seq.ids_sent < seq.generated or end is not None)):
            self._delta(seq, rest, end)
        # (the end-of-text id that ended it counts, as its id is given and vLLM counts it)
        usage = Usage(seq.prompt_len, seq.generated + (end is not None))
        lp = tuple(seq.logprobs) if seq.logprobs is not None else None
        ids = tuple(seq.ids[seq.prompt_len :]) + ((end,) if end is not None else ()) if asked else None
        ending = Ending(0, seq.text.text, reason, lp, ids)
        prompt = tuple(seq.ids[: seq.prompt_len]) if asked else None
        seq.sink(Done(seq.job.id, reason, usage, seq.text.text, choices=(ending,), prompt_ids=prompt))

    def _drop_rows(self, seqs: list[Seq]) -> None:
        gone = [s.row for s in seqs if s.row >= 0]
        if not gone:
            return
        self.batch.remove(gone)
        dropped = set(gone)
        self.rows = [s for s in self.rows if s.row not in dropped]
        for s in seqs:
            s.row = -1
        for i, s in enumerate(self.rows):
            s.row = i
