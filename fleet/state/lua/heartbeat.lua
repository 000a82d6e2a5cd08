#!lua flags=allow-oom
-- heartbeat: renew a node's lease and publish its inventory.
-- allow-oom (Redis >= 7.0): at maxmemory Redis refuses writes, but leases must still renew, or
-- every node would fence its jobs; a renewal only overwrites what exists (memory-neutral).
-- KEYS[1] node lease  KEYS[2] node hash  KEYS[3] nodes set  KEYS[4] nodes version counter
-- KEYS[5] nodes changed zset (name -> version of its last change the scheduler must see)
-- ARGV[1] agent id  ARGV[2] lease TTL ms  ARGV[3] now  ARGV[4] node name
-- ARGV[5] JSON object of node fields to set (inventory, capacity, runtime); its 'sched' field
-- digests what placement depends on, so a node is marked changed only when that changes (GPU
-- utilisation and temperature change every beat and do not count)
-- Returns {1, ''} when the node (re)joined (lease was absent), {0, ''} on renewal,
-- {-1, holder} when another agent holds this node's lease (two agents, one node name).
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return {-1, holder}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local before = redis.call('HGET', KEYS[2], 'sched')
local fields = cjson.decode(ARGV[5])
redis.call('HSET', KEYS[2], 'name', ARGV[4], 'heartbeat_at', ARGV[3], 'agent', ARGV[1])
for field, value in pairs(fields) do
  redis.call('HSET', KEYS[2], field, tostring(value))
end
if redis.call('HSETNX', KEYS[2], 'state', 'READY') == 1 then
  redis.call('HSET', KEYS[2], 'reason', 'joined', 'changed_at', ARGV[3])
end
if not holder or before ~= fields['sched'] then
  redis.call('ZADD', KEYS[5], redis.call('INCR', KEYS[4]), ARGV[4])
end
redis.call('SADD', KEYS[3], ARGV[4])
if holder then
  return {0, ''}
end
return {1, ''}
