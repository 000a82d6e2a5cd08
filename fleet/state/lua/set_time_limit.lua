-- set_time_limit: a new time limit for a job on its nodes (fleet update JOB --timeout): its spec is
-- replaced while it still holds the attempt the caller read, in one atomic step. The agents read the
-- job each reconcile and stop the attempt at the new limit (fleet.agent.exits.time_limit).
-- KEYS[1] job hash  KEYS[2] job event stream
-- ARGV[1] now  ARGV[2] reason (a history entry)  ARGV[3] the new spec (JSON)  ARGV[4] the attempt read
-- Returns {1, state} when applied, {0, state} when the job is no longer on a node in that attempt
-- (it ended, or was requeued), {-1, ''} for no such job.
local job = redis.call('HMGET', KEYS[1], 'state', 'attempt', 'node')
local state = job[1]
if not state then
  return {-1, ''}
end
if (state ~= 'SCHEDULED' and state ~= 'STARTING' and state ~= 'RUNNING') or job[2] ~= ARGV[4] then
  return {0, state}
end
redis.call('HSET', KEYS[1], 'spec', ARGV[3], 'updated_at', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'rev', 1)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'at', ARGV[1], 'state', state,
  'attempt', job[2], 'reason', ARGV[2], 'node', job[3] or '')
return {1, state}
