-- place_many: bind QUEUED jobs to nodes and specific GPUs in one call, each a new attempt.
-- Fenced by the leader lease: only the controller holding it may place (checked once, up front;
-- the whole call is atomic, so the lease cannot change halfway).
-- KEYS[1] leader key  KEYS[2] claims hash (uuid -> job:attempt)
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[1]:
--   <p>:job:<id>, <p>:job:<id>:events, <p>:jobs:queued, <p>:jobs:state:QUEUED|SCHEDULED,
--   <p>:node:<node>, <p>:node:<node>:lease, <p>:node:<node>:jobs,
--   <p>:node:<node>:alloc (job id -> "<cpus> <memory>" granted on the node); for a task of a job
--   array, <p>:array:<array id>:active (its tasks on nodes);
--   <p>:nodes:version and <p>:nodes:changed (each node placed on is marked changed: see fleet.keys)
-- ARGV[1] key prefix  ARGV[2] leader value  ARGV[3] now
-- ARGV[4] JSON list of placements {job, node, gpus, cpus, memory, reason, rev}; rev: the job's
--   revision the leader read (absent: 0); a job changed since (held, updated: its 'rev' moved on)
--   or held is refused, and read again by the leader. A multi-node job (gang)
--   also has members: [{node, gpus, cpus, memory}, ...] rank 0 first (node and gpus then repeat
--   rank 0's) and master_addr, rank 0's address: every member is placed or none, and the job gets
--   members ([[node, [uuids]], ...]), master_addr and a master_port taken from rank 0's
--   <p>:node:<node>:ports hash (port -> job id)
-- ARGV[5] first rendezvous port  ARGV[6] how many ports from there a node offers gangs
-- Returns {-2} when not the leader, else one entry per placement: the new attempt, or 0 (refused:
-- the job is no longer queued, or held or changed since, a node is down or not READY, a GPU is claimed, or rank 0's node has
-- no rendezvous port left).
-- It checks only what others change, or what a write here would overwrite: the leader lease, the
-- job's state (a cancel), its hold and revision (a user's hold or update), a node's lease and state (its agent, an operator), GPU claims and ports
-- (one holder each). Whether a job's CPUs and memory fit a node, and whether an array has room
-- under its max_running, is the scheduler's rule alone (fleet.scheduler.feasible, and the queue's
-- array room), decided and explained there: only this script, under the leader lease, adds node
-- grants and array tasks on nodes, so the leader's counts, read each pass, are never short.
-- Here they are only recorded (the node's alloc hash, the array's active set).
--! include ranked
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return {-2}
end
local p, now = ARGV[1], ARGV[3]

-- a free rendezvous port on the node of a gang's rank 0 (its <p>:node:<node>:ports hash: port -> job)
local function rendezvous_port(node, job)
  local ports = p .. ':node:' .. node .. ':ports'
  for port = tonumber(ARGV[5]), tonumber(ARGV[5]) + tonumber(ARGV[6]) - 1 do
    if redis.call('HSETNX', ports, tostring(port), job) == 1 then return port end
  end
  return nil
end

-- whether one member (a node's part of the job) can go where the entry says: its node is up and
-- READY, and none of its GPUs is claimed
local function member_free(m, seen)
  local node_key = p .. ':node:' .. m.node
  if seen[m.node] then return false end
  seen[m.node] = true
  if redis.call('EXISTS', node_key .. ':lease') == 0 then return false end
  if redis.call('HGET', node_key, 'state') ~= 'READY' then return false end
  for _, uuid in ipairs(m.gpus) do
    if redis.call('HEXISTS', KEYS[2], uuid) == 1 then return false end
  end
  return true
end

local function encoded(list)
  if #list == 0 then return '[]' end
  return cjson.encode(list)
end

local function place(e)
  local job_key = p .. ':job:' .. e.job
  local job = redis.call('HMGET', job_key, 'state', 'array', 'held_by', 'rev')
  if job[1] ~= 'QUEUED' then return 0 end
  if (job[3] or '') ~= '' or tonumber(job[4] or '0') ~= tonumber(e.rev or 0) then return 0 end
  -- a gang's members, rank 0 first, or the one node of a single-node job: all fit, or none is taken
  local members = e.members or {{node = e.node, gpus = e.gpus, cpus = e.cpus, memory = e.memory}}
  local seen = {}
  for _, m in ipairs(members) do
    if not member_free(m, seen) then return 0 end
  end
  local port = nil
  if #members > 1 then
    port = rendezvous_port(members[1].node, e.job)
    if not port then return 0 end
  end
  local attempt = redis.call('HINCRBY', job_key, 'attempt', 1)
  for _, m in ipairs(members) do
    local node_key = p .. ':node:' .. m.node
    for _, uuid in ipairs(m.gpus) do
      redis.call('HSET', KEYS[2], uuid, e.job .. ':' .. attempt)
    end
    local cpus, memory = tonumber(m.cpus) or 0, tonumber(m.memory) or 0
    if cpus > 0 or memory > 0 then
      redis.call('HSET', node_key .. ':alloc', e.job, cpus .. ' ' .. memory)
    end
    redis.call('SADD', node_key .. ':jobs', e.job)
    redis.call('ZADD', p .. ':nodes:changed', redis.call('INCR', p .. ':nodes:version'), m.node)
  end
  redis.call('HSET', job_key, 'state', 'SCHEDULED', 'node', members[1].node, 'gpus', encoded(members[1].gpus),
    'reason', e.reason, 'updated_at', now, 'scheduled_at', now, 'state_since', now, 'exit_code', '')
  if port then
    local parts = {}
    for i, m in ipairs(members) do parts[i] = {m.node, m.gpus} end
    redis.call('HSET', job_key, 'members', cjson.encode(parts), 'master_addr', e.master_addr or '',
      'master_port', port)
    -- the most members any attempt had: retention deletes that many log streams per attempt
    if #members > (tonumber(redis.call('HGET', job_key, 'max_members')) or 1) then
      redis.call('HSET', job_key, 'max_members', #members)
    end
    redis.call('HDEL', job_key, 'members_running', 'members_done')
    for rank = 0, #members - 1 do redis.call('HDEL', job_key, 'm' .. rank) end
  end
  ranked_remove(p, e.job)
  redis.call('SREM', p .. ':jobs:state:QUEUED', e.job)
  redis.call('SADD', p .. ':jobs:state:SCHEDULED', e.job)
  if job[2] then redis.call('SADD', p .. ':array:' .. job[2] .. ':active', e.job) end
  redis.call('XADD', job_key .. ':events', 'MAXLEN', '~', 1000, '*', 'at', now, 'state', 'SCHEDULED',
    'attempt', attempt, 'reason', e.reason, 'node', members[1].node)
  return attempt
end

local results = {}
for i, e in ipairs(cjson.decode(ARGV[4])) do
  results[i] = place(e)
end
return results
