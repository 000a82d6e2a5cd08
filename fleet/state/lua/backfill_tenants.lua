-- backfill_tenants: give jobs stored by a version before the per-tenant indexes their place in
-- them: the 'queue' field ("<priority> <tenant>", on a task's array record) and an entry in the
-- tenant's listing, <prefix>:jobs:of:<tenant>. Jobs gone meanwhile (retention) are skipped, and no
-- record is created. Queued jobs are ranked by ranked_repair.lua afterwards.
-- Derived keys, from ARGV[1]: <prefix>:job:<id>, <prefix>:array:<id>, <prefix>:jobs:of:<tenant>.
-- ARGV[1] key prefix  ARGV[2], ARGV[3], ...: job ids
-- Returns how many it added to a listing.
--! include ranked
local prefix, added = ARGV[1], 0
for i = 2, #ARGV do
  local seq = redis.call('HGET', prefix .. ':job:' .. ARGV[i], 'seq')
  local queue = seq and queue_field(prefix, ARGV[i])
  local tenant = queue and string.match(queue, '^%-?%d+ (.+)$')
  if tenant then
    added = added + redis.call('ZADD', prefix .. ':jobs:of:' .. tenant, seq, ARGV[i])
  end
end
return added
