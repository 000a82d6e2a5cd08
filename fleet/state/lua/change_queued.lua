-- change_queued: a user's change of a QUEUED job (fleet hold, release, update) in one atomic step,
-- so that no placement slips between the check and the write; every change bumps the job's 'rev',
-- and place_many.lua refuses a placement the leader decided from an older revision.
-- KEYS[1] job hash  KEYS[2] job event stream
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster): the queue's index
--   (lib/ranked.lua) from ARGV[5], when the job's rank changes, and the changed-jobs feed
--   (lib/changed.lua).
-- ARGV[1] job id  ARGV[2] now  ARGV[3] reason (a history entry)  ARGV[4] JSON object of fields to set
-- ARGV[5] key prefix  ARGV[6] 'free': only a job nobody holds (a hold), 'held': only a held one (a
--   release), '': either (an update)  ARGV[7] the job's new 'queue' field ("<priority> <tenant>"),
--   '' to keep its place in the queue
-- Returns {1, state} when applied, {0, state} when the job is not QUEUED, {2, held_by} when ARGV[6]
-- does not hold (already held, or not held), {-1, ''} for no such job.
--! include ranked
--! include changed
local job = redis.call('HMGET', KEYS[1], 'state', 'attempt', 'held_by')
local state, held = job[1], job[3] or ''
if not state then
  return {-1, ''}
end
if state ~= 'QUEUED' then
  return {0, state}
end
if (ARGV[6] == 'free' and held ~= '') or (ARGV[6] == 'held' and held == '') then
  return {2, held}
end
local prefix = ARGV[5]
if ARGV[7] ~= '' then
  ranked_remove(prefix, ARGV[1])
  redis.call('HSET', KEYS[1], 'queue', ARGV[7])
  ranked_add(prefix, ARGV[1])
end
for field, value in pairs(cjson.decode(ARGV[4])) do
  redis.call('HSET', KEYS[1], field, tostring(value))
end
redis.call('HINCRBY', KEYS[1], 'rev', 1)
mark_changed(prefix, ARGV[1])
redis.call('HSET', KEYS[1], 'reason', ARGV[3], 'updated_at', ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'at', ARGV[2], 'state', state,
  'attempt', job[2] or '0', 'reason', ARGV[3], 'node', '')
return {1, state}
