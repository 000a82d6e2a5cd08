-- expire_node: remove the record of a node gone for longer than node_retention_s that holds no job.
-- Checked again here: no lease (no agent heartbeats it), no job on it, last heartbeat at or before
-- the cutoff. Its bus queue lives in another logical DB and is deleted by the caller afterwards.
-- Fenced by the leader lease: only the controller holding it removes. It only deletes, so it runs
-- on a Redis at maxmemory too.
-- KEYS[1] node hash  KEYS[2] node lease  KEYS[3] node jobs set  KEYS[4] nodes set
-- KEYS[5] quarantined nodes hash  KEYS[6] leader key
-- ARGV[1] the leader value this write is fenced by  ARGV[2] node name  ARGV[3] cutoff (unix s)
-- Returns 1 when removed, 0 when the node is back, holds a job or heartbeat since the cutoff,
-- -2 when ARGV[1] is not the current leader.
if redis.call('GET', KEYS[6]) ~= ARGV[1] then
  return -2
end
if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('SCARD', KEYS[3]) > 0 then
  return 0
end
local heartbeat = tonumber(redis.call('HGET', KEYS[1], 'heartbeat_at')) or 0
if heartbeat > tonumber(ARGV[3]) then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[2])
redis.call('HDEL', KEYS[5], ARGV[2])
return 1
