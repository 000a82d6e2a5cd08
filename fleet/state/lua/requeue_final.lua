-- requeue_final: queue final jobs again (fleet requeue ARRAY --failed: an array's failed tasks run
-- again under their own ids), each a fresh start of its retry budget; the next placement is its next
-- attempt, resuming from its last checkpoint as any requeue does. One atomic step for all the ids.
-- KEYS[1] ended zset (retention's: a job queued again leaves it)  KEYS[2] QUEUED set
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[1]:
--   <prefix>:job:<id> hashes and <prefix>:job:<id>:events streams, <prefix>:jobs:state:<STATE>
--   sets, the queue's index (lib/ranked.lua) and the changed-jobs feed (lib/changed.lua).
-- ARGV[1] key prefix  ARGV[2] now  ARGV[3] reason  ARGV[4] the states a job may be requeued from,
--   comma separated (final ones)
-- ARGV[5], ARGV[6], ...: job ids
-- Returns, for each id in order, two values: code (1 requeued, 0 not in ARGV[4], -1 no such job)
-- and the state it was in.
--! include ranked
--! include changed
local prefix, now, reason = ARGV[1], ARGV[2], ARGV[3]
local allowed = {}
for s in string.gmatch(ARGV[4], '[^,]+') do
  allowed[s] = true
end
local out = {}
local function answer(code, state)
  out[#out + 1] = code
  out[#out + 1] = state
end
for i = 5, #ARGV do
  local id = ARGV[i]
  local key = prefix .. ':job:' .. id
  local job = redis.call('HMGET', key, 'state', 'attempt')
  local state = job[1]
  if not state then
    answer(-1, '')
  elseif not allowed[state] then
    answer(0, state)
  else
    redis.call('HSET', key, 'state', 'QUEUED', 'reason', reason, 'updated_at', now, 'state_since', now,
      'not_before', '0', 'failures', '0', 'infra_requeues', '0', 'cancel_requested', '0',
      'exit_code', '', 'finished_at', '', 'preempt', '', 'preempted_for', '', 'node', '', 'gpus', '[]')
    redis.call('HINCRBY', key, 'rev', 1)
    redis.call('SREM', prefix .. ':jobs:state:' .. state, id)
    redis.call('SADD', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    ranked_add(prefix, id)
    mark_changed(prefix, id)
    redis.call('XADD', key .. ':events', 'MAXLEN', '~', 1000, '*', 'at', now, 'state', 'QUEUED',
      'attempt', job[2] or '0', 'reason', reason, 'node', '')
    answer(1, state)
  end
end
return out
