-- ranked_repair: rank QUEUED jobs the queue holds by seq alone (stored by a version before the
-- per-tenant index, lib/ranked.lua) or that their tenant's queue lacks, and drop ids from a
-- tenant's queue that the queue lacks. The
-- leader's resync calls it with the ids where the two differ. A job to rank gets its 'queue' field
-- ("<priority> <tenant>") from its spec (a task: on its array's record).
-- KEYS[1] queued zset
-- Derived keys, from ARGV[1]: <prefix>:job:<id>, <prefix>:array:<id>, <prefix>:queue:<tenant> and
-- <prefix>:queue:@tenants.
-- ARGV[1] key prefix  ARGV[2] a tenant whose queue the ids below may wrongly be in, or ''
-- ARGV[3], ARGV[4], ...: job ids
-- Returns how many jobs it ranked or dropped.
--! include ranked
local prefix = ARGV[1]
local fixed = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local score = tonumber(redis.call('ZSCORE', KEYS[1], id))
  if score then
    if score < RANK_UNIT then queue_field(prefix, id) end
    local _, _, tenant = rank_of(prefix, id)
    if score < RANK_UNIT or (tenant and not redis.call('ZSCORE', prefix .. ':queue:' .. tenant, id)) then
      ranked_add(prefix, id)
      fixed = fixed + 1
    end
  elseif ARGV[2] ~= '' and redis.call('ZSCORE', prefix .. ':queue:' .. ARGV[2], id) then
    unrank(prefix, ARGV[2], id)
    fixed = fixed + 1
  end
end
return fixed
