"""The Lua scripts of :mod:`laneway.store.redis_db` (Redis runs each one atomically)."""

# KEYS: none; ARGV[1] is the prefix. Line numbers are zero-padded members so that
# zset ties sort in line order.
LUA_PUT_FILE = """
local p = ARGV[1]
local seq = redis.call('INCR', p .. 'seq')
redis.call('HSET', p .. 'f:' .. ARGV[2], 'tenant', ARGV[3], 'purpose', ARGV[4], 'filename', ARGV[5],
  'bytes', ARGV[6], 'created_at', ARGV[7], 'seq', seq)
redis.call('SET', p .. 'fc:' .. ARGV[2], ARGV[8])
redis.call('ZADD', p .. 'files:' .. ARGV[3], seq, ARGV[2])
return seq
"""
LUA_DELETE_FILE = """
local p = ARGV[1]
local key = p .. 'f:' .. ARGV[2]
if redis.call('HGET', key, 'tenant') ~= ARGV[3] then return 0 end
redis.call('DEL', key, p .. 'fc:' .. ARGV[2])
redis.call('ZREM', p .. 'files:' .. ARGV[3], ARGV[2])
return 1
"""
LUA_CREATE_BATCH = """
local p = ARGV[1]
local id = ARGV[2]
local key = p .. 'b:' .. id
if redis.call('EXISTS', key) == 1 then return redis.error_reply('batch exists') end
local seq = redis.call('INCR', p .. 'seq')
redis.call('HSET', key, 'seq', seq)
for i = 5, #ARGV, 2 do redis.call('HSET', key, ARGV[i], ARGV[i + 1]) end
redis.call('ZADD', p .. 'batches:' .. ARGV[3], seq, id)
redis.call('ZADD', p .. 'bs:' .. ARGV[4], seq, id)
return seq
"""
# ARGV: prefix, id, new status, stamp field, now, then the source statuses
LUA_SET_STATUS = """
local p = ARGV[1]
local key = p .. 'b:' .. ARGV[2]
local cur = redis.call('HGET', key, 'status')
if not cur then return 0 end
local ok = false
for i = 6, #ARGV do if ARGV[i] == cur then ok = true end end
if not ok then return 0 end
local seq = redis.call('HGET', key, 'seq')
redis.call('HSET', key, 'status', ARGV[3], ARGV[4], ARGV[5])
redis.call('ZREM', p .. 'bs:' .. cur, ARGV[2])
redis.call('ZADD', p .. 'bs:' .. ARGV[3], seq, ARGV[2])
return 1
"""
# ARGV: prefix, id, now, total, staging prefix. The lines were written under the staging
# prefix (one per attempt): they become the batch's only if it is still validating, so two
# runners starting one batch at once never mix or delete each other's lines.
LUA_START_BATCH = """
local p, id, stage = ARGV[1], ARGV[2], ARGV[5]
local key = p .. 'b:' .. id
local names = {'ld:', 'lst:', 'latt:', 'lq:'}
local status = redis.call('HGET', key, 'status')
-- (cancelled while it was validated: its lines are written all the same, to be answered
-- batch_cancelled, so that every custom_id is in one of its two files)
local unstarted = status == 'cancelling' and not redis.call('HGET', key, 'in_progress_at')
  and redis.call('EXISTS', p .. 'ld:' .. id) == 0
if status ~= 'validating' and not unstarted then
  for _, n in ipairs(names) do redis.call('DEL', stage .. n) end
  return 0
end
for _, n in ipairs({'ld:', 'lst:', 'latt:', 'lown:', 'lres:', 'lq:', 'lr:'}) do
  redis.call('DEL', p .. n .. id)
end
for _, n in ipairs(names) do
  if redis.call('EXISTS', stage .. n) == 1 then redis.call('RENAME', stage .. n, p .. n .. id) end
end
if unstarted then
  redis.call('HSET', key, 'total', ARGV[4])
  return 1
end
local seq = redis.call('HGET', key, 'seq')
redis.call('HSET', key, 'status', 'in_progress', 'in_progress_at', ARGV[3], 'total', ARGV[4])
redis.call('ZREM', p .. 'bs:validating', id)
redis.call('ZADD', p .. 'bs:in_progress', seq, id)
return 1
"""
# ARGV: prefix, id, now, errors, error file id or '', then (if a file) its fields and content
LUA_FAIL_BATCH = """
local p = ARGV[1]
local key = p .. 'b:' .. ARGV[2]
local status = redis.call('HGET', key, 'status')
-- (cancelled while it was validated: it fails with its errors all the same)
local unstarted = status == 'cancelling' and not redis.call('HGET', key, 'in_progress_at')
if status ~= 'validating' and not unstarted then return 0 end
local seq = redis.call('HGET', key, 'seq')
redis.call('HSET', key, 'status', 'failed', 'failed_at', ARGV[3], 'errors', ARGV[4])
if ARGV[5] ~= '' then
  local fseq = redis.call('INCR', p .. 'seq')
  redis.call('HSET', p .. 'f:' .. ARGV[5], 'tenant', ARGV[6], 'purpose', ARGV[7], 'filename', ARGV[8],
    'bytes', ARGV[9], 'created_at', ARGV[10], 'seq', fseq)
  redis.call('SET', p .. 'fc:' .. ARGV[5], ARGV[11])
  redis.call('ZADD', p .. 'files:' .. ARGV[6], fseq, ARGV[5])
  redis.call('HSET', key, 'error_file_id', ARGV[5])
end
redis.call('ZREM', p .. 'bs:' .. status, ARGV[2])
redis.call('ZADD', p .. 'bs:failed', seq, ARGV[2])
return 1
"""
# ARGV: prefix, batch, owner, limit, lease until, now, grace, long grace -> {line, data,
# attempts, ...}. A line whose lease ran out is claimed again only once its owner's request
# cannot still be running: an owner the cluster took for dead (its tombstone) whose slots
# the leader no longer holds for it, nor is about to (PREFIX reaping: its quarantine is not
# written yet) (a process that stood still runs its requests on until
# its engine shows them gone: laneway.cluster.leader); an owner alive whose lease ran out
# over ``grace`` ago (it dropped the line); an owner neither alive nor dead (not taken for
# dead yet, or not a replica's name) once its lease ran out over ``long grace`` ago.
LUA_CLAIM = """
local p, b, owner = ARGV[1], ARGV[2], ARGV[3]
local limit, untl, now, grace = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local long = tonumber(ARGV[8])
local lq, lr = p .. 'lq:' .. b, p .. 'lr:' .. b
local picked = redis.call('ZRANGEBYSCORE', lq, '-inf', now, 'LIMIT', 0, limit)
if #picked < limit then
  local expired = redis.call('ZRANGEBYSCORE', lr, '-inf', '(' .. now, 'WITHSCORES', 'LIMIT', 0, 256)
  local held = nil
  for i = 1, #expired, 2 do
    if #picked >= limit then break end
    local no, ends = expired[i], tonumber(expired[i + 1])
    local prev = redis.call('HGET', p .. 'lown:' .. b, no)
    local ok = true
    if prev then
      if redis.call('EXISTS', p .. 'alive:' .. prev) == 1 then
        ok = ends + grace <= now
      elseif redis.call('EXISTS', p .. 'dead:' .. prev) == 1 then
        ok = redis.call('SISMEMBER', p .. 'reaping', prev) == 0
        if held == nil then held = redis.call('HKEYS', p .. 'loans') end
        for _, k in ipairs(held) do
          if string.sub(k, 1, #prev + 1) == prev .. '|' then ok = false end
        end
      else
        ok = ends + long <= now
      end
    end
    if ok then
      if prev then redis.call('SREM', p .. 'own:' .. prev, b .. '|' .. no) end
      picked[#picked + 1] = no
    end
  end
end
local out = {}
for _, no in ipairs(picked) do
  redis.call('ZREM', lq, no)
  redis.call('ZADD', lr, untl, no)
  redis.call('HSET', p .. 'lst:' .. b, no, 'r')
  redis.call('HSET', p .. 'lown:' .. b, no, owner)
  local attempts = redis.call('HINCRBY', p .. 'latt:' .. b, no, 1)
  redis.call('SADD', p .. 'own:' .. owner, b .. '|' .. no)
  out[#out + 1] = no
  out[#out + 1] = redis.call('HGET', p .. 'ld:' .. b, no)
  out[#out + 1] = attempts
end
return out
"""
# ARGV: prefix, owner, lease until, then (batch, line) of each line the owner runs now. Only
# those are renewed: a line the owner holds but no longer runs (its task is gone) is left
# to run out its lease and be claimed again.
LUA_RENEW = """
local p, owner = ARGV[1], ARGV[2]
for i = 4, #ARGV, 2 do
  local b, no = ARGV[i], ARGV[i + 1]
  local mine = redis.call('HGET', p .. 'lown:' .. b, no) == owner
  if mine and redis.call('HGET', p .. 'lst:' .. b, no) == 'r' then
    redis.call('ZADD', p .. 'lr:' .. b, 'XX', ARGV[3], no)
  end
end
return 1
"""
# ARGV: prefix, batch, line, owner, state (d/f), result, input tokens, output tokens
LUA_FINISH = """
local p, b, no, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if redis.call('HGET', p .. 'lst:' .. b, no) ~= 'r' or redis.call('HGET', p .. 'lown:' .. b, no) ~= owner then
  return 0
end
if redis.call('HSETNX', p .. 'lres:' .. b, no, ARGV[6]) == 0 then
  return redis.error_reply('a line result is written once')
end
redis.call('HSET', p .. 'lst:' .. b, no, ARGV[5])
redis.call('HDEL', p .. 'lown:' .. b, no)
redis.call('ZREM', p .. 'lr:' .. b, no)
redis.call('SREM', p .. 'own:' .. owner, b .. '|' .. no)
local key = p .. 'b:' .. b
if ARGV[5] == 'd' then
  redis.call('HINCRBY', key, 'completed', 1)
  redis.call('HINCRBY', key, 'input_tokens', ARGV[7])
  redis.call('HINCRBY', key, 'output_tokens', ARGV[8])
else
  redis.call('HINCRBY', key, 'failed', 1)
end
return 1
"""
# ARGV: prefix, batch, line, owner, not before, attempts to take back ('0' or '1')
LUA_RELEASE = """
local p, b, no, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if redis.call('HGET', p .. 'lst:' .. b, no) ~= 'r' or redis.call('HGET', p .. 'lown:' .. b, no) ~= owner then
  return 0
end
redis.call('HSET', p .. 'lst:' .. b, no, 'q')
redis.call('HDEL', p .. 'lown:' .. b, no)
redis.call('ZREM', p .. 'lr:' .. b, no)
redis.call('ZADD', p .. 'lq:' .. b, ARGV[5], no)
if ARGV[6] ~= '0' then redis.call('HINCRBY', p .. 'latt:' .. b, no, -1) end
redis.call('SREM', p .. 'own:' .. owner, b .. '|' .. no)
return 1
"""
# ARGV: prefix, owner -> lines put back
LUA_RELEASE_OWNER = """
local p, owner = ARGV[1], ARGV[2]
local n = 0
for _, m in ipairs(redis.call('SMEMBERS', p .. 'own:' .. owner)) do
  local b, no = string.match(m, '^(.*)|(%d+)$')
  local mine = redis.call('HGET', p .. 'lown:' .. b, no) == owner
  if mine and redis.call('HGET', p .. 'lst:' .. b, no) == 'r' then
    redis.call('HSET', p .. 'lst:' .. b, no, 'q')
    redis.call('HDEL', p .. 'lown:' .. b, no)
    redis.call('ZREM', p .. 'lr:' .. b, no)
    redis.call('ZADD', p .. 'lq:' .. b, 0, no)
    if tonumber(redis.call('HGET', p .. 'latt:' .. b, no) or '0') > 0 then
      redis.call('HINCRBY', p .. 'latt:' .. b, no, -1)
    end
    n = n + 1
  end
end
redis.call('DEL', p .. 'own:' .. owner)
return n
"""
