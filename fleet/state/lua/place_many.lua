-- place_many: bind QUEUED jobs to nodes and specific GPUs in one call, each a new attempt.
-- Fenced by the leader lease: only the controller holding it may place (checked once, up front;
-- the whole call is atomic, so the lease cannot change halfway).
-- KEYS[1] leader key  KEYS[2] claims hash (uuid -> job:attempt)
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[1]:
--   <p>:job:<id>, <p>:job:<id>:events, <p>:jobs:queued, <p>:jobs:state:QUEUED|SCHEDULED,
--   <p>:node:<node>, <p>:node:<node>:lease, <p>:node:<node>:jobs,
--   <p>:node:<node>:alloc (job id -> "<cpus> <memory>" granted on the node); for a task of a job
--   array, <p>:array:<array id> (its max_running) and <p>:array:<array id>:active (its tasks on nodes);
--   <p>:nodes:version and <p>:nodes:changed (each node placed on is marked changed: see fleet.keys)
-- ARGV[1] key prefix  ARGV[2] leader value  ARGV[3] now
-- ARGV[4] JSON list of placements {job, node, gpus, cpus, memory, reason}
-- Returns {-2} when not the leader, else one entry per placement: the new attempt, or 0 (refused:
-- the job is no longer queued, the node is down or not READY, a GPU is claimed, the node's CPUs
-- or memory are taken, or the job is a task of an array that has max_running tasks on nodes).
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return {-2}
end
local p, now = ARGV[1], ARGV[3]

local function fits(node_key, alloc_key, cpus, memory)
  if cpus <= 0 and memory <= 0 then return true end
  local total_cpus = tonumber(redis.call('HGET', node_key, 'cpus') or '0') or 0
  local total_mem = tonumber(redis.call('HGET', node_key, 'memory') or '0') or 0
  local used_cpus, used_mem = 0, 0
  for _, grant in ipairs(redis.call('HVALS', alloc_key)) do
    local c, m = string.match(grant, '^(%S+) (%S+)$')
    used_cpus = used_cpus + (tonumber(c) or 0)
    used_mem = used_mem + (tonumber(m) or 0)
  end
  if total_cpus > 0 and used_cpus + cpus > total_cpus + 1e-9 then return false end
  if total_mem > 0 and used_mem + memory > total_mem then return false end
  return true
end

-- the active set of the job's array when a task may join it, false when the array is at its limit
local function array_slot(array)
  local active = p .. ':array:' .. array .. ':active'
  local limit = tonumber(redis.call('HGET', p .. ':array:' .. array, 'max_running'))
  if limit and redis.call('SCARD', active) >= limit then return false end
  return active
end

local function place(e)
  local job_key, node_key = p .. ':job:' .. e.job, p .. ':node:' .. e.node
  local alloc_key = node_key .. ':alloc'
  local job = redis.call('HMGET', job_key, 'state', 'array')
  if job[1] ~= 'QUEUED' then return 0 end
  local active = nil
  if job[2] then
    active = array_slot(job[2])
    if not active then return 0 end
  end
  if redis.call('EXISTS', node_key .. ':lease') == 0 then return 0 end
  if redis.call('HGET', node_key, 'state') ~= 'READY' then return 0 end
  for _, uuid in ipairs(e.gpus) do
    if redis.call('HEXISTS', KEYS[2], uuid) == 1 then return 0 end
  end
  local cpus, memory = tonumber(e.cpus) or 0, tonumber(e.memory) or 0
  if not fits(node_key, alloc_key, cpus, memory) then return 0 end
  local attempt = redis.call('HINCRBY', job_key, 'attempt', 1)
  for _, uuid in ipairs(e.gpus) do
    redis.call('HSET', KEYS[2], uuid, e.job .. ':' .. attempt)
  end
  if cpus > 0 or memory > 0 then
    redis.call('HSET', alloc_key, e.job, cpus .. ' ' .. memory)
  end
  local gpus = cjson.encode(e.gpus)
  if #e.gpus == 0 then gpus = '[]' end
  redis.call('HSET', job_key, 'state', 'SCHEDULED', 'node', e.node, 'gpus', gpus, 'reason', e.reason,
    'updated_at', now, 'scheduled_at', now, 'state_since', now, 'exit_code', '')
  redis.call('ZREM', p .. ':jobs:queued', e.job)
  redis.call('SREM', p .. ':jobs:state:QUEUED', e.job)
  redis.call('SADD', p .. ':jobs:state:SCHEDULED', e.job)
  redis.call('SADD', node_key .. ':jobs', e.job)
  redis.call('ZADD', p .. ':nodes:changed', redis.call('INCR', p .. ':nodes:version'), e.node)
  if active then redis.call('SADD', active, e.job) end
  redis.call('XADD', job_key .. ':events', 'MAXLEN', '~', 1000, '*', 'at', now, 'state', 'SCHEDULED',
    'attempt', attempt, 'reason', e.reason, 'node', e.node)
  return attempt
end

local results = {}
for i, e in ipairs(cjson.decode(ARGV[4])) do
  results[i] = place(e)
end
return results
