-- backfill_tenants: give jobs stored by a version before the per-tenant indexes their place in
-- them: the 'queue' field ("<priority> <tenant>", on a task's array record) and an entry in the
-- tenant's listing, <prefix>:jobs:of:<tenant>. Jobs gone meanwhile (retention) are skipped, and no
-- record is created. Queued jobs are ranked by ranked_repair.lua afterwards.
-- Derived keys, from ARGV[1]: <prefix>:job:<id>, <prefix>:array:<id>, <prefix>:jobs:of:<tenant>.
-- ARGV[1] key prefix  ARGV[2], ARGV[3], ...: job ids
-- Returns how many it added to a listing.
local prefix, added = ARGV[1], 0
for i = 2, #ARGV do
  local key = prefix .. ':job:' .. ARGV[i]
  local f = redis.call('HMGET', key, 'seq', 'queue', 'array', 'spec')
  local holder, queue, spec = key, f[2], f[4]
  if f[3] then
    holder = prefix .. ':array:' .. f[3]
    local a = redis.call('HMGET', holder, 'queue', 'spec')
    queue, spec = a[1], a[2]
  end
  if f[1] and not queue and spec then
    local ok, data = pcall(cjson.decode, spec)
    if ok and type(data) == 'table' then
      queue = string.format('%d', math.floor(tonumber(data.priority) or 0)) .. ' ' .. tostring(data.tenant or 'default')
      redis.call('HSET', holder, 'queue', queue)
    end
  end
  local tenant = queue and string.match(queue, '^%-?%d+ (.+)$')
  if f[1] and tenant then
    added = added + redis.call('ZADD', prefix .. ':jobs:of:' .. tenant, f[1], ARGV[i])
  end
end
return added
