-- transition: move a job between states, fenced by its attempt number.
-- KEYS[1] job hash  KEYS[2] job event stream  KEYS[3] claims hash  KEYS[4] queued zset
-- KEYS[5] leader key  KEYS[6] ended zset (final jobs by end time, for retention)
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster):
--   <prefix>:jobs:state:<STATE> sets, <prefix>:node:<node>:jobs and <prefix>:node:<node>:alloc
--   (the CPUs and memory granted to the job there, released with its claims), from ARGV[9]; for a
--   task of a job array leaving the nodes, <prefix>:array:<array id>:active; releasing a node's
--   claims marks it changed (<prefix>:nodes:version, <prefix>:nodes:changed: see fleet.keys). A
--   multi-node job releases every member's node the same way, and its rendezvous port on rank 0's
--   node (<prefix>:node:<node>:ports).
-- ARGV[1] job id
-- ARGV[2] expected attempt, '' for any (user actions); a stale attempt changes nothing
-- ARGV[3] allowed current states, comma separated
-- ARGV[4] new state, '' to stay (set fields and record an event only)
-- ARGV[5] reason   ARGV[6] now
-- ARGV[7] JSON object of fields to set   ARGV[8] JSON object of counters to increment
-- ARGV[9] key prefix   ARGV[10] '1' to release the attempt's GPU claims and node binding
-- ARGV[11] '0' to leave the event stream alone (a queued job's changing wait reason)
-- ARGV[12] the leader value ("<id>:<token>") a controller write is fenced by; '' for agents and users
-- An end of a job flagged cancel_requested (a requeue to QUEUED, or SUCCEEDED or FAILED) ends it
-- CANCELLED instead: a cancel acknowledged while the attempt's end was being recorded (the caller
-- decided from an older read; an exit recorded late, across a Redis failover) is never lost.
-- A move into a final state (SUCCEEDED, FAILED, CANCELLED: fleet.models.FINAL_STATES) adds the job to
-- the ended zset, scored by now, so that retention deletes it job_retention_s later, appends it
-- to <prefix>:outbox (capped at about 50,000 entries), which the leader's webhook sender reads, and
-- writes its accounting row (<prefix>:acct:<day>, lib/accounting.lua). A move into RUNNING sets
-- 'run_from'; releasing an attempt that was RUNNING adds its time to the job's accounting counters.
-- Returns {1, state} when applied, {0, current state} when refused, {-1, ''} for no such job,
-- {-2, ''} when ARGV[12] is not the current leader.
--! include ranked
--! include accounting
if ARGV[12] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[12] then
  return {-2, ''}
end
local job = redis.call('HMGET', KEYS[1], 'state', 'attempt', 'node', 'gpus', 'cancel_requested', 'array')
local state, attempt, node, gpus = job[1], job[2], job[3], job[4]
if not state then
  return {-1, ''}
end
if ARGV[2] ~= '' and ARGV[2] ~= attempt then
  return {0, state}
end
local allowed = false
for s in string.gmatch(ARGV[3], '[^,]+') do
  if s == state then allowed = true end
end
if not allowed then
  return {0, state}
end
local to, reason = ARGV[4], ARGV[5]
if to == '' then to = state end
local cancelled = (to == 'QUEUED' or to == 'SUCCEEDED' or to == 'FAILED') and job[5] == '1'
if cancelled then
  to, reason = 'CANCELLED', 'cancelled by user'
end
local prefix = ARGV[9]
local ended = false
redis.call('HSET', KEYS[1], 'state', to, 'reason', reason, 'updated_at', ARGV[6])
for field, value in pairs(cjson.decode(ARGV[7])) do
  redis.call('HSET', KEYS[1], field, tostring(value))
end
if cancelled then
  redis.call('HSET', KEYS[1], 'finished_at', ARGV[6])
else
  for field, by in pairs(cjson.decode(ARGV[8])) do
    redis.call('HINCRBY', KEYS[1], field, by)
  end
end
if to ~= state then
  redis.call('HSET', KEYS[1], 'state_since', ARGV[6])
  redis.call('SREM', prefix .. ':jobs:state:' .. state, ARGV[1])
  redis.call('SADD', prefix .. ':jobs:state:' .. to, ARGV[1])
  if state == 'QUEUED' then ranked_remove(prefix, ARGV[1]) end
  if to == 'QUEUED' then ranked_add(prefix, ARGV[1]) end
  if to == 'RUNNING' then redis.call('HSET', KEYS[1], 'run_from', ARGV[6]) end
  if to == 'SUCCEEDED' or to == 'FAILED' or to == 'CANCELLED' then
    redis.call('ZADD', KEYS[6], ARGV[6], ARGV[1])
    ended = true
    redis.call('XADD', prefix .. ':outbox', 'MAXLEN', '~', 50000, '*', 'kind', 'job', 'id', ARGV[1],
      'state', to)
  end
  if job[6] and to ~= 'SCHEDULED' and to ~= 'STARTING' and to ~= 'RUNNING' then
    redis.call('SREM', prefix .. ':array:' .. job[6] .. ':active', ARGV[1])
  end
end
if ARGV[10] == '1' and node and node ~= '' then
  local owner = ARGV[1] .. ':' .. attempt
  -- every member of a multi-node job ([[node, [uuids]], ...], rank 0 first), or its one node
  local gang = redis.call('HMGET', KEYS[1], 'members', 'master_port')
  local parts = {{node, cjson.decode(gpus or '[]')}}
  if gang[1] and gang[1] ~= '' then parts = cjson.decode(gang[1]) end
  acct_attempt(prefix, KEYS[1], ARGV[1], state, ARGV[6], parts)
  for _, part in ipairs(parts) do
    for _, uuid in ipairs(part[2]) do
      if redis.call('HGET', KEYS[3], uuid) == owner then
        redis.call('HDEL', KEYS[3], uuid)
      end
    end
    redis.call('SREM', prefix .. ':node:' .. part[1] .. ':jobs', ARGV[1])
    redis.call('HDEL', prefix .. ':node:' .. part[1] .. ':alloc', ARGV[1])
    redis.call('ZADD', prefix .. ':nodes:changed', redis.call('INCR', prefix .. ':nodes:version'), part[1])
  end
  if gang[2] and gang[2] ~= '' then
    local ports = prefix .. ':node:' .. parts[1][1] .. ':ports'
    if redis.call('HGET', ports, gang[2]) == ARGV[1] then redis.call('HDEL', ports, gang[2]) end
  end
  if to == 'QUEUED' then
    redis.call('HSET', KEYS[1], 'node', '', 'gpus', '[]')
    redis.call('HDEL', KEYS[1], 'members', 'master_addr', 'master_port', 'members_running', 'members_done')
    for rank = 0, #parts - 1 do redis.call('HDEL', KEYS[1], 'm' .. rank) end
  end
end
if ended then
  acct_final(prefix, ARGV[1], to, ARGV[6])
end
if ARGV[11] == '0' then
  return {1, to}
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'at', ARGV[6], 'state', to,
  'attempt', attempt or '0', 'reason', reason, 'node', node or '')
return {1, to}
