"""What the leader writes to Redis with each batch of decisions, in one fenced script
(:meth:`laneway.cluster.lease.Lease.fenced`): the changed entries of the table of live
requests, each replica's decisions (one stream entry each), the changed loans and how far
the events have been read — all of it or nothing."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from laneway.cluster.codec import TableEntry
from laneway.cluster.lending import Lender

# after the fence: KEYS reqs, pos, loans, applied; ARGV prefix, pos, n sets (rid, entry)...,
# n dels (rid)..., n replicas (replica, its decisions as one JSON list)..., n loans set
# (replica|worker, loan)..., n loans ended (replica|worker)..., n applied (replica, its last
# event entry applied)..., n applied dropped (replica: taken for dead, its quarantine written
# with this commit, so it leaves PREFIX reaping too)...
COMMIT = """
local i = 3
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]); i = i + 2 end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('HDEL', KEYS[1], ARGV[i]); i = i + 1 end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local key = ARGV[1] .. 'dec:' .. ARGV[i]
  redis.call('XADD', key, 'MAXLEN', '~', 10000, '*', 'b', ARGV[i + 1])
  redis.call('PEXPIRE', key, 3600000)
  i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]); i = i + 2 end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('HDEL', KEYS[3], ARGV[i]); i = i + 1 end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1]); i = i + 2 end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HDEL', KEYS[4], ARGV[i])
  redis.call('SREM', ARGV[1] .. 'reaping', ARGV[i])
  i = i + 1
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""


def commit_args(
    prefix: str,
    pos: str,
    sets: Sequence[tuple[str, TableEntry]],
    dels: Sequence[str] | set[str],
    out: Sequence[tuple[str, list[Any]]],
    me: str,
    lender: Lender,
    applied: Mapping[str, int] | None = None,
    unapplied: Sequence[str] = (),
) -> list[Any]:
    """:data:`COMMIT`'s arguments: ``sets`` / ``dels`` of the table, the decisions ``out``
    (home, encoded) but those for ``me`` (delivered in the process), the loans changed,
    the last event entry applied of each replica that sent some (``applied``) and the
    replicas forgotten (``unapplied``)."""
    args: list[Any] = [prefix, pos, len(sets)]
    for rid, entry in sets:
        args += [rid, json.dumps(entry.to_json(), separators=(",", ":"))]
    args.append(len(dels))
    args += list(dels)
    remote: dict[str, list[list[Any]]] = {}
    for home, e in out:
        if home != me:
            remote.setdefault(home, []).append(e)
    args.append(len(remote))
    for home, es in remote.items():  # a replica's decisions in one entry (``b``: a list)
        args += [home, json.dumps(es, separators=(",", ":"))]
    lent = [k for k in lender.changed if k in lender.loans]
    args.append(len(lent))
    for home, w in lent:
        args += [f"{home}|{w}", json.dumps(lender.loans[(home, w)].to_list())]
    ended = [f"{home}|{w}" for home, w in lender.changed if (home, w) not in lender.loans]
    args.append(len(ended))
    args += ended
    applied = applied or {}
    args.append(len(applied))
    for home, n in applied.items():
        args += [home, n]
    args.append(len(unapplied))
    args += list(unapplied)
    return args
