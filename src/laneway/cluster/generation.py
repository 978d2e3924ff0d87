"""Whether Redis still holds what the cluster wrote to it: the generation check.

A Redis restarted without its data (its append-only file gone: empty), from an
older copy (a backup, a snapshot), or with writes lost (``appendfsync
everysec`` and a crash) looks like a healthy Redis. laneway notices it:

- ``PREFIX gen`` names the data set (a random id, made once), and every replica's
  heartbeat counts ``PREFIX gen:seq`` up by one in the same script that reads
  both (:data:`CHECK`). Each replica keeps the last figure it was given, in memory
  and in its data directory (``cluster-generation.json``, so that one restarted
  remembers it too);
- a Redis that answers with no generation (empty), another one (replaced), or a
  count not above the last one seen (an older copy; writes lost) lost laneway's
  data: :class:`Generation` says so (a :class:`Loss`), and records it in Redis
  (``PREFIX lost``) for every replica to see. A new generation is made at once,
  so that fencing tokens (:mod:`laneway.cluster.lease`: they carry the
  generation) of before the loss can never be taken for ones of after it.

What follows a loss (refusing new files and batches, ``/readyz`` failing, the
log naming what was lost, the scheduler rebuilt from what the replicas run) is
the node's; ``laneway cluster accept-loss`` ends it once an operator has
restored what could be restored.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from laneway.private_files import write_private

log = logging.getLogger("laneway.cluster")

FILE = "cluster-generation.json"
SAVE_EVERY_S = 2.0  # how often the figure seen is written to the data directory

# KEYS gen, gen:seq, lost; ARGV a new generation id to make if there is none ('': make none)
# -> {generation or false, count, the loss recorded or false}
CHECK = """
local g = redis.call('GET', KEYS[1])
if not g then
  if ARGV[1] == '' then return {false, 0, redis.call('GET', KEYS[3])} end
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], 0)
  g = ARGV[1]
end
return {g, redis.call('INCR', KEYS[2]), redis.call('GET', KEYS[3])}
"""
# KEYS lost, gen, gen:seq; ARGV the loss (JSON), a new generation id: recorded once (the first
# replica to see it says it), with a new generation (epochs counted again from an older copy
# then make tokens never given out before) -> the loss recorded
RECORD = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('GET', KEYS[1]) end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[3], 0)
return ARGV[1]
"""


@dataclass(frozen=True)
class Loss:
    """Redis came back without the cluster's data."""

    kind: str  # "empty", "older" (an older copy, or writes lost), "replaced" (another data set)
    at: float  # when it was seen (time.time)
    by: str  # the replica that saw it first
    detail: str

    @property
    def message(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at))
        return f"Redis came back without laneway's data ({self.detail}; seen by {self.by} at {when})"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> Loss | None:
        try:
            d = json.loads(raw)
            return cls(str(d["kind"]), float(d["at"]), str(d["by"]), str(d["detail"]))
        except (ValueError, KeyError, TypeError):
            return None


class Generation:
    """What this replica knows of the data set in Redis: its id and the last count seen."""

    def __init__(self, data_dir: Path | None, prefix: str, replica: str) -> None:
        self.path = data_dir / FILE if data_dir is not None else None
        self.prefix = prefix
        self.replica = replica
        self.id: str | None = None
        self.seen = 0
        self._saved = 0.0
        self._load()

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            d = json.loads(self.path.read_text())
            if d.get("prefix") == self.prefix:
                self.id, self.seen = str(d["id"]), int(d["seen"])

    def save(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.path is None or self.id is None or (not force and now - self._saved < SAVE_EVERY_S):
            return
        self._saved = now
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_private(self.path, json.dumps({"prefix": self.prefix, "id": self.id, "seen": self.seen}))

    def keys(self) -> list[str]:
        return [self.prefix + "gen", self.prefix + "gen:seq", self.prefix + "lost"]

    def args(self) -> list[str]:
        """:data:`CHECK`'s: a new id to make, where this replica knows of none."""
        return [uuid.uuid4().hex[:16] if self.id is None else ""]

    def judge(self, got: Any) -> Loss | None:
        """The answer of :data:`CHECK`: a :class:`Loss` if Redis lost what was seen. After a
        loss this replica knows no generation: its next check makes or takes the new one."""
        gen = got[0].decode() if isinstance(got[0], bytes) else got[0]
        n = int(got[1])
        loss = None
        if self.id is not None:
            if not gen:
                loss = Loss("empty", time.time(), self.replica, "it holds no laneway data: restarted empty")
            elif gen != self.id:
                loss = Loss("replaced", time.time(), self.replica, f"it holds another data set ({gen})")
            elif n <= self.seen:
                detail = (
                    f"restarted from an older copy, or writes were lost: its count is {n}, "
                    f"{self.seen} was seen"
                )
                loss = Loss("older", time.time(), self.replica, detail)
        if loss is not None or not gen:
            self.id, self.seen = None, 0
        else:
            changed = gen != self.id
            self.id, self.seen = gen, n
            self.save(force=changed)
        return loss

    @staticmethod
    def recorded(got: Any) -> Loss | None:
        """The loss recorded in Redis (by any replica), from :data:`CHECK`'s answer."""
        raw = got[2] if len(got) > 2 else None
        return Loss.from_json(raw) if raw else None
