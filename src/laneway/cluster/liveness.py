"""Which replicas live: heartbeats, and the leader taking a silent one for dead.

Each replica process (its *home*: name and a random suffix) says it lives every
:data:`ALIVE_TTL_S` / 3 by setting ``PREFIX alive:HOME`` with a time to live of
:data:`ALIVE_TTL_S`. The leader takes a home whose key is gone for dead: it
cancels that home's requests (their slots are given to others) and ends its loans.

Both steps are atomic and leave a mark, so that a Redis that restarted (or stood
still) does not kill a cluster that is alive:

- the leader takes a home for dead only in one script that finds its key gone
  *and* writes a tombstone ``PREFIX dead:HOME`` (:data:`REAP`); and only once it
  has reached Redis without a gap for :data:`ALIVE_TTL_S` (after Redis was away,
  every key may have expired meanwhile: each replica gets a full period to say it
  lives again);
- a replica's heartbeat (:data:`HEARTBEAT`) sets its key again whether or not it
  had expired, unless the tombstone is there: then, and only then, it was taken
  for dead, and it goes on under a new name with nothing in flight.

So a replica is never taken for dead while its heartbeats get through, and one
that was learns it for certain.
"""

from __future__ import annotations

ALIVE_TTL_S = 3.0  # a replica whose heartbeat has not come for this long is taken for dead
DEAD_TTL_S = 86_400  # a tombstone is kept this long (a replica paused longer is long gone)

# KEYS alive:HOME, dead:HOME, the lease; ARGV ttl_ms -> {1: alive, 0: it was taken for dead;
# the lease's value (who leads, with its token) or false}
HEARTBEAT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return {0, false} end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return {1, redis.call('GET', KEYS[3])}
"""

# (fenced: after the fence) ARGV prefix, dead ttl_s, homes... -> the homes taken for dead now.
# Each is also put in ``PREFIX reaping`` until the leader's next commit has written the slots
# its requests may still hold (their quarantine: laneway.cluster.lending): until then nothing
# may take a batch line of it on the strength of its tombstone alone (LUA_CLAIM).
REAP = """
local out = {}
for i = 3, #ARGV do
  local h = ARGV[i]
  if redis.call('EXISTS', ARGV[1] .. 'alive:' .. h) == 0 then
    redis.call('SET', ARGV[1] .. 'dead:' .. h, '1', 'EX', ARGV[2])
    redis.call('SADD', ARGV[1] .. 'reaping', h)
    out[#out + 1] = h
  end
end
return out
"""
