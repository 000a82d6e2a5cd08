-- trim_accounting: delete the accounting rows of days that ended before a cutoff (their retention,
-- accounting_retention_s, is over). Fenced by the leader lease: only the controller holding it writes.
-- KEYS[1] days zset (<prefix>:acct:days)  KEYS[2] leader key
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[2]:
--   <prefix>:acct:<day> hashes.
-- ARGV[1] the leader value this write is fenced by  ARGV[2] key prefix
-- ARGV[3] the first day kept  ARGV[4] most days deleted in this call
-- Returns the number of days deleted, -2 when ARGV[1] is not the current leader.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -2
end
local days = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3], 'LIMIT', 0, tonumber(ARGV[4]))
for _, day in ipairs(days) do
  redis.call('DEL', ARGV[2] .. ':acct:' .. day)
  redis.call('ZREM', KEYS[1], day)
end
return #days
