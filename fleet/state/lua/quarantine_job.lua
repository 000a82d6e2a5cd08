-- quarantine_job: set aside a job record fleet cannot read, so that it stops nothing else.
-- The hash itself is kept for inspection (and in the all-jobs zset); the job leaves the queue,
-- every state set and its node's jobs set, and the GPU claims of any of its attempts are released.
-- KEYS[1] job hash  KEYS[2] job event stream  KEYS[3] quarantined jobs hash (id -> reason)
-- KEYS[4] queued zset  KEYS[5] claims hash  KEYS[6] leader key
-- KEYS[7] ended zset: a quarantined record is deleted job_retention_s after it was set aside
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[4]:
--   <prefix>:jobs:state:<STATE> sets, <prefix>:node:<node>:jobs, <prefix>:node:<node>:alloc and,
--   for a task of a job array, <prefix>:array:<array id>:active; the node is marked changed
--   (<prefix>:nodes:version, <prefix>:nodes:changed: see fleet.keys).
-- ARGV[1] job id  ARGV[2] reason  ARGV[3] now  ARGV[4] key prefix
-- ARGV[5] the leader value this controller write is fenced by  ARGV[6] every job state, comma separated
-- Returns 1 when quarantined now, 0 when it already was, -2 when ARGV[5] is not the current leader.
--! include ranked
if redis.call('GET', KEYS[6]) ~= ARGV[5] then
  return -2
end
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then
  return 0
end
local prefix = ARGV[4]
ranked_remove(prefix, ARGV[1])
redis.call('ZADD', KEYS[7], ARGV[3], ARGV[1])
local job = redis.call('HMGET', KEYS[1], 'state', 'node', 'attempt', 'array')
for s in string.gmatch(ARGV[6], '[^,]+') do
  redis.call('SREM', prefix .. ':jobs:state:' .. s, ARGV[1])
end
if job[1] then
  redis.call('SREM', prefix .. ':jobs:state:' .. job[1], ARGV[1])
end
if job[2] and job[2] ~= '' then
  redis.call('SREM', prefix .. ':node:' .. job[2] .. ':jobs', ARGV[1])
  redis.call('HDEL', prefix .. ':node:' .. job[2] .. ':alloc', ARGV[1])
  redis.call('ZADD', prefix .. ':nodes:changed', redis.call('INCR', prefix .. ':nodes:version'), job[2])
end
-- the other members of a multi-node job, if its members field still parses
local gang = redis.call('HMGET', KEYS[1], 'members', 'master_port')
local ok, parts = pcall(cjson.decode, gang[1] or '')
if ok and type(parts) == 'table' then
  for rank, part in ipairs(parts) do
    if type(part) == 'table' and type(part[1]) == 'string' then
      redis.call('SREM', prefix .. ':node:' .. part[1] .. ':jobs', ARGV[1])
      redis.call('HDEL', prefix .. ':node:' .. part[1] .. ':alloc', ARGV[1])
      redis.call('ZADD', prefix .. ':nodes:changed', redis.call('INCR', prefix .. ':nodes:version'), part[1])
      local ports = prefix .. ':node:' .. part[1] .. ':ports'
      if rank == 1 and gang[2] and redis.call('HGET', ports, gang[2]) == ARGV[1] then
        redis.call('HDEL', ports, gang[2])
      end
    end
  end
end
if job[4] then
  redis.call('SREM', prefix .. ':array:' .. job[4] .. ':active', ARGV[1])
end
local owner = ARGV[1] .. ':'
local claims = redis.call('HGETALL', KEYS[5])
for i = 1, #claims, 2 do
  if string.sub(claims[i + 1], 1, #owner) == owner then
    redis.call('HDEL', KEYS[5], claims[i])
  end
end
local attempt = job[3]
if not tonumber(attempt) then attempt = '0' end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'at', ARGV[3], 'state', 'QUARANTINED',
  'attempt', attempt, 'reason', ARGV[2], 'node', job[2] or '')
return 1
