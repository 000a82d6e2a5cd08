-- submit_array: create a job array (its record, with the spec stored once) and a batch of its
-- tasks, each a QUEUED job "<array id>-<index>" holding its array id and index instead of a spec.
-- Idempotent: tasks that exist already (a retried submit, an earlier batch) are left as they are.
-- The whole batch is one atomic step: either every task of it is created or none is.
-- KEYS[1] array hash  KEYS[2] seq counter  KEYS[3] all-jobs zset  KEYS[4] queued zset
-- KEYS[5] QUEUED set  KEYS[6] arrays zset  KEYS[7] job hash with the array's id
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[7]:
--   <prefix>:job:<task id> hashes and <prefix>:job:<task id>:expired tombstones.
-- ARGV[1] array id  ARGV[2] spec JSON  ARGV[3] indices in normal form  ARGV[4] number of tasks
-- ARGV[5] max running, '' for no limit  ARGV[6] now  ARGV[7] key prefix  ARGV[8] reason
-- ARGV[9] '1' when fleet generated the id: an existing record then must be this submit's own
--   (created at ARGV[6] by an earlier batch or try), never another array's
-- ARGV[10] owner: the user who submitted it ('' when unknown; its tasks read it from the array)
-- ARGV[11] the spec's priority  ARGV[12] its tenant (the queue's order: lib/ranked.lua; the
--   tasks of one array all have the same rank but for their seq); the tasks join the tenant's
--   listing, <prefix>:jobs:of:<tenant>, too
-- ARGV[13] the hex digest of a function's call ('' for none): the array holds that blob while its
--   record lasts (lib/blobs.lua) and its record names it as 'call', for expire_jobs.lua
-- ARGV[14], ARGV[15], ...: the indices of this batch
-- Returns {tasks created, ''}; {-1, field} when the array exists with another spec, indices or
-- max running; {-2, task id} when a job that is not this array's task holds a task's id;
-- {-3, ''} when a job has the array's id; {-4, task id} while the tombstone of an expired job
-- holds a task's id (a new task must not inherit its checkpoint directory); {-5, ''} when a
-- generated id (ARGV[9]) is another array's.
-- The record counts its tasks not yet deleted by retention ("left"): expire_jobs.lua deletes the
-- record with the last one.
--! include ranked
--! include blobs
if redis.call('EXISTS', KEYS[7]) == 1 then
  return {-3, ''}
end
local id, prefix, now = ARGV[1], ARGV[7], ARGV[6]
local stored = redis.call('HMGET', KEYS[1], 'spec', 'indices', 'max_running', 'seq_hi', 'created_at')
if stored[1] and ARGV[9] == '1' and stored[5] ~= now then
  return {-5, ''}
end
if stored[1] then
  if stored[1] ~= ARGV[2] then return {-1, 'spec'} end
  if stored[2] ~= ARGV[3] then return {-1, 'indices'} end
  if stored[3] ~= ARGV[5] then return {-1, 'max_running'} end
end
local todo = {}
for i = 14, #ARGV do
  local task = id .. '-' .. ARGV[i]
  local owner = redis.call('HMGET', prefix .. ':job:' .. task, 'id', 'array')
  if owner[1] and owner[2] ~= id then
    return {-2, task}
  elseif not owner[1] then
    if redis.call('EXISTS', prefix .. ':job:' .. task .. ':expired') == 1 then
      return {-4, task}
    end
    todo[#todo + 1] = ARGV[i]
  end
end
if not stored[1] then
  redis.call('HSET', KEYS[1], 'id', id, 'spec', ARGV[2], 'indices', ARGV[3], 'size', ARGV[4],
    'max_running', ARGV[5], 'created_at', now, 'owner', ARGV[10])
  if ARGV[13] ~= '' then
    redis.call('HSET', KEYS[1], 'call', ARGV[13])
    blob_hold(prefix, ARGV[13], id)
  end
end
if #todo == 0 then
  return {0, ''}
end
local hi = redis.call('INCRBY', KEYS[2], #todo)
local lo = hi - #todo + 1
if not stored[1] then
  redis.call('HSET', KEYS[1], 'seq', lo)
  redis.call('ZADD', KEYS[6], lo, id)
elseif tonumber(stored[4]) ~= lo - 1 then
  -- another submit took seqs between two batches: listings cannot skip this array's seq range
  redis.call('HSET', KEYS[1], 'gaps', '1')
end
redis.call('HSET', KEYS[1], 'seq_hi', hi, 'queue', ARGV[11] .. ' ' .. ARGV[12])
local by_tenant = prefix .. ':queue:' .. ARGV[12]
local base = (1000 - tonumber(ARGV[11])) * RANK_UNIT
redis.call('HINCRBY', KEYS[1], 'left', #todo)
local scored, ranks = {}, {}
for n, index in ipairs(todo) do
  local task, seq = id .. '-' .. index, lo + n - 1
  redis.call('HSET', prefix .. ':job:' .. task, 'id', task, 'array', id, 'index', index, 'state', 'QUEUED',
    'attempt', 0, 'created_at', now, 'reason', ARGV[8], 'seq', seq)
  scored[#scored + 1] = seq
  scored[#scored + 1] = task
  ranks[#ranks + 1] = string.format('%d', base + seq)
  ranks[#ranks + 1] = task
  if #scored >= 1000 or n == #todo then
    redis.call('ZADD', KEYS[3], unpack(scored))
    redis.call('ZADD', prefix .. ':jobs:of:' .. ARGV[12], unpack(scored))
    redis.call('ZADD', KEYS[4], unpack(ranks))
    redis.call('ZADD', by_tenant, unpack(ranks))
    redis.call('SADD', prefix .. ':queue:@tenants', ARGV[12])
    ranks = {}
    local members = {}
    for m = 2, #scored, 2 do members[#members + 1] = scored[m] end
    redis.call('SADD', KEYS[5], unpack(members))
    scored = {}
  end
end
return {#todo, ''}
