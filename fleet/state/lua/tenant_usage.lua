-- tenant_usage: the leader's fold of what runs into each tenant's decayed usage, and the tenants'
-- status it publishes with it, written together so a reader never sees one without the other.
-- Compare-and-set on the fold time: a fold computed from a read another fold overtook is refused
-- (the caller reads again), so no GPU-second is counted twice.
-- KEYS[1] leader key  KEYS[2] usage hash (tenant -> GPU-seconds, @at -> fold time)
-- KEYS[3] status hash (tenant -> TenantStatus JSON, @at -> when published)
-- ARGV[1] the leader value this write is fenced by  ARGV[2] the @at the fold read ('' for none)
-- ARGV[3] JSON object: the new usage hash, whole  ARGV[4] JSON object: the new status hash, whole
-- Returns 1 when written, 0 when @at moved since the read, -2 when ARGV[1] is not the leader.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -2
end
if (redis.call('HGET', KEYS[2], '@at') or '') ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3])
for _, pair in ipairs({{KEYS[2], ARGV[3]}, {KEYS[3], ARGV[4]}}) do
  for field, value in pairs(cjson.decode(pair[2])) do
    redis.call('HSET', pair[1], field, value)
  end
end
return 1
