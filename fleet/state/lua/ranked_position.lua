-- ranked_position: where QUEUED jobs stand (read only; the queue's order: lib/ranked.lua).
-- KEYS[1] queued zset
-- Derived keys, from ARGV[1]: <prefix>:job:<id>, <prefix>:array:<id>, <prefix>:queue:<tenant>.
-- ARGV[1] key prefix  ARGV[2], ARGV[3], ...: job ids
-- Returns, for each id in order, {tenant, place in its tenant's queue, its tenant's queued jobs,
-- place in the whole queue, queued jobs} (places count from 1), or {} for a job not queued or not
-- yet ranked (stored by an older version: the leader's resync ranks it).
--! include ranked
local prefix = ARGV[1]
local queued = redis.call('ZCARD', KEYS[1])
local out = {}
for i = 2, #ARGV do
  local overall = redis.call('ZRANK', KEYS[1], ARGV[i])
  local _, seq, tenant = rank_of(prefix, ARGV[i])
  local mine = overall and seq and tenant and redis.call('ZRANK', prefix .. ':queue:' .. tenant, ARGV[i])
  if mine then
    out[#out + 1] = {tenant, mine + 1, redis.call('ZCARD', prefix .. ':queue:' .. tenant), overall + 1, queued}
  else
    out[#out + 1] = {}
  end
end
return out
