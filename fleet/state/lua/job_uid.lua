-- job_uid: a tenant's offset in agent.job_uid_range, allocated the first time it is asked for.
-- Offsets are handed out in order (the next one is how many tenants have one) and never reused or
-- removed, so a tenant has the same uid on every node and its files on shared storage stay its own.
-- KEYS[1] <prefix>:job_uids (tenant -> offset)
-- ARGV[1] tenant  ARGV[2] the range's size
-- Returns the tenant's offset, or -1 when it has none and the range is spent (nothing is recorded).
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held then
  return tonumber(held)
end
local offset = redis.call('HLEN', KEYS[1])
if offset >= tonumber(ARGV[2]) then
  return -1
end
redis.call('HSET', KEYS[1], ARGV[1], offset)
return offset
