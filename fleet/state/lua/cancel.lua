-- cancel: a user's cancel of one job or many (a job array, a label), so that no placement or
-- requeue can slip between a check and a write. A QUEUED job becomes CANCELLED at once; a job on a
-- node is flagged for its agent to stop (and transition.lua turns any later requeue of a flagged
-- job into CANCELLED). The whole call is one atomic step.
-- KEYS[1] queued zset  KEYS[2] QUEUED set  KEYS[3] CANCELLED set
-- KEYS[4] ended zset (final jobs by end time, for retention)
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[1]:
--   <prefix>:job:<id> hashes and <prefix>:job:<id>:events streams; <prefix>:outbox gets each job
--   cancelled at once (the webhook sender's feed, as in transition.lua); each such job's accounting
--   row goes to <prefix>:acct:<day> (lib/accounting.lua).
-- ARGV[1] key prefix  ARGV[2] now  ARGV[3] on-node job states, comma separated
-- ARGV[4], ARGV[5], ...: job ids
-- Returns, for each job id in order, four values: code, state, node, attempt. code 1: cancelled
-- at once; 2: flagged (or already flagged) on a node; 0: already final; -1: no such job.
--! include ranked
--! include accounting
local on_node = {}
for s in string.gmatch(ARGV[3], '[^,]+') do
  on_node[s] = true
end
local prefix, now = ARGV[1], ARGV[2]

local function cancel(id)
  local key = prefix .. ':job:' .. id
  local job = redis.call('HMGET', key, 'state', 'attempt', 'node', 'cancel_requested')
  local state, attempt, node, flagged = job[1], job[2] or '0', job[3] or '', job[4]
  if not state then
    return -1, '', '', '0'
  end
  if state == 'QUEUED' then
    redis.call('HSET', key, 'state', 'CANCELLED', 'reason', 'cancelled by user', 'updated_at', now,
      'state_since', now, 'finished_at', now, 'cancel_requested', '1')
    ranked_remove(prefix, id)
    redis.call('SREM', KEYS[2], id)
    redis.call('SADD', KEYS[3], id)
    redis.call('ZADD', KEYS[4], now, id)
    acct_final(prefix, id, 'CANCELLED', now)
    redis.call('XADD', prefix .. ':outbox', 'MAXLEN', '~', 50000, '*', 'kind', 'job', 'id', id,
      'state', 'CANCELLED')
    redis.call('XADD', key .. ':events', 'MAXLEN', '~', 1000, '*', 'at', now, 'state', 'CANCELLED',
      'attempt', attempt, 'reason', 'cancelled by user', 'node', node)
    return 1, 'CANCELLED', node, attempt
  end
  if not on_node[state] then
    return 0, state, node, attempt
  end
  if flagged ~= '1' then
    redis.call('HSET', key, 'cancel_requested', '1', 'reason', 'cancel requested', 'updated_at', now)
    redis.call('XADD', key .. ':events', 'MAXLEN', '~', 1000, '*', 'at', now, 'state', state,
      'attempt', attempt, 'reason', 'cancel requested', 'node', node)
  end
  return 2, state, node, attempt
end

local out = {}
for i = 4, #ARGV do
  local code, state, node, attempt = cancel(ARGV[i])
  out[#out + 1] = code
  out[#out + 1] = state
  out[#out + 1] = node
  out[#out + 1] = attempt
end
return out
