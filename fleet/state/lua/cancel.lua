-- cancel: a user's cancel in one step, so no placement or requeue can slip between a check and a write.
-- A QUEUED job becomes CANCELLED at once; a job on a node is flagged for its agent to stop (and
-- transition.lua turns any later requeue of a flagged job into CANCELLED).
-- KEYS[1] job hash  KEYS[2] job event stream  KEYS[3] queued zset  KEYS[4] QUEUED set
-- KEYS[5] CANCELLED set  KEYS[6] ended zset (final jobs by end time, for retention)
-- ARGV[1] job id  ARGV[2] now  ARGV[3] on-node states, comma separated
-- Returns {1, 'CANCELLED'} when cancelled at once, {2, state} when flagged (or already flagged),
-- {0, state} when the job is already final, {-1, ''} for no such job.
local job = redis.call('HMGET', KEYS[1], 'state', 'attempt', 'node', 'cancel_requested')
local state, attempt, node, flagged = job[1], job[2], job[3], job[4]
if not state then
  return {-1, ''}
end
if state == 'QUEUED' then
  redis.call('HSET', KEYS[1], 'state', 'CANCELLED', 'reason', 'cancelled by user', 'updated_at', ARGV[2],
    'state_since', ARGV[2], 'finished_at', ARGV[2], 'cancel_requested', '1')
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('SREM', KEYS[4], ARGV[1])
  redis.call('SADD', KEYS[5], ARGV[1])
  redis.call('ZADD', KEYS[6], ARGV[2], ARGV[1])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'at', ARGV[2], 'state', 'CANCELLED',
    'attempt', attempt, 'reason', 'cancelled by user', 'node', node or '')
  return {1, 'CANCELLED'}
end
local on_node = false
for s in string.gmatch(ARGV[3], '[^,]+') do
  if s == state then on_node = true end
end
if not on_node then
  return {0, state}
end
if flagged == '1' then
  return {2, state}
end
redis.call('HSET', KEYS[1], 'cancel_requested', '1', 'reason', 'cancel requested', 'updated_at', ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'at', ARGV[2], 'state', state,
  'attempt', attempt, 'reason', 'cancel requested', 'node', node or '')
return {2, state}
