"""What this replica created in the shared store: so that a loss can be named.

A replica of a cluster appends a line to ``DATA_DIR/cluster-journal.jsonl`` for
each batch and file it creates (its id, tenant and time), and one for each file
it deletes. When Redis comes back without laneway's data
(:mod:`laneway.cluster.generation`), each replica looks up what it created: what
Redis no longer holds was lost, and is named in the log and answered 410 from
then on (not a silent 404). Lines older than :data:`KEEP_S` are dropped when the
journal is opened.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from laneway.private_files import append_private, write_private

FILE = "cluster-journal.jsonl"
KEEP_S = 31 * 86_400  # what was created longer ago than this is no longer tracked


@dataclass(frozen=True)
class Created:
    kind: str  # "batch" or "file"
    id: str
    tenant: str
    at: float


class Journal:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE
        self._prune()

    def _prune(self) -> None:
        if not self.path.exists():
            return
        keep = [c for c in self._read() if c.at > time.time() - KEEP_S]
        deleted = {c.id for c in keep if c.kind == "deleted"}
        lines = [
            json.dumps({"kind": c.kind, "id": c.id, "tenant": c.tenant, "at": c.at})
            for c in keep
            if c.id not in deleted or c.kind == "deleted"
        ]
        with contextlib.suppress(OSError):
            write_private(self.path, "".join(line + "\n" for line in lines))

    def _read(self) -> list[Created]:
        out = []
        with contextlib.suppress(OSError):
            for line in self.path.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    d = json.loads(line)
                    out.append(Created(str(d["kind"]), str(d["id"]), str(d["tenant"]), float(d["at"])))
        return out

    def record(self, kind: str, object_id: str, tenant: str) -> None:
        """``kind``: "batch", "file", or "deleted" (a file deleted through this replica)."""
        line = json.dumps({"kind": kind, "id": object_id, "tenant": tenant, "at": time.time()})
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            append_private(self.path, line + "\n")

    def created(self) -> list[Created]:
        """The batches and files created through this replica (and not deleted through it)."""
        entries = self._read()
        deleted = {c.id for c in entries if c.kind == "deleted"}
        return [c for c in entries if c.kind in ("batch", "file") and c.id not in deleted]
