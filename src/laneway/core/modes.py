"""The words of preemption, as string-valued enums (so that the wire and the configuration
keep their strings):

- :class:`PreemptionMode`: how a policy frees a slot for more urgent work (its
  ``preemption``): never (``none``), by waiting for a victim to end (``drain``), by
  stopping it always one way (``checkpoint``, ``recompute``), or choosing per case
  (``auto``);
- :class:`StopMode`: how one victim is stopped, and so how it comes back: its state saved
  and restored (``checkpoint``), or its context computed again (``recompute``). A
  :class:`~laneway.core.decisions.Preempt` carries it, a request keeps it
  (``Request.resume``) and its next :class:`~laneway.core.decisions.Dispatch` says it.
"""

from __future__ import annotations

import enum


class PreemptionMode(enum.StrEnum):
    NONE = "none"
    DRAIN = "drain"
    AUTO = "auto"
    CHECKPOINT = "checkpoint"
    RECOMPUTE = "recompute"


class StopMode(enum.StrEnum):
    CHECKPOINT = "checkpoint"
    RECOMPUTE = "recompute"
