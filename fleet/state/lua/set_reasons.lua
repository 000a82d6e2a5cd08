-- set_reasons: the waiting reasons of QUEUED jobs, many in one call (what a scheduling pass writes).
-- Only a job still QUEUED takes its reason; no history entry (a waiting reason is not an event).
-- Fenced by the leader lease. Derived keys: <prefix>:job:<id> (fleet runs on one Redis, never Cluster).
-- KEYS[1] leader key
-- ARGV[1] leader value  ARGV[2] key prefix  ARGV[3] now  ARGV[4] JSON object: job id -> reason
-- Returns how many reasons were set, or -2 when ARGV[1] is not the current leader.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -2
end
local set = 0
for id, reason in pairs(cjson.decode(ARGV[4])) do
  local key = ARGV[2] .. ':job:' .. id
  if redis.call('HGET', key, 'state') == 'QUEUED' then
    redis.call('HSET', key, 'reason', reason, 'updated_at', ARGV[3])
    set = set + 1
  end
end
return set
