-- node_state: set a node's admin state (operators; the controller's DRAINED, fenced by its lease).
-- KEYS[1] node hash  KEYS[2] nodes set  KEYS[3] leader key  KEYS[4] nodes version counter
-- KEYS[5] nodes changed zset
-- ARGV[1] node name
-- ARGV[2] the leader value a controller write is fenced by; '' for operators
-- ARGV[3] states the admin state must be in now, comma separated; '' for any
-- ARGV[4] JSON object of fields to set (state, reason, changed_at/by, drain deadline and grace)
-- Returns 1 when set, 0 when the current state is not allowed, -1 for no such node,
-- -2 when ARGV[2] is not the current leader.
if ARGV[2] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[2] then
  return -2
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then
  return -1
end
if ARGV[3] ~= '' then
  local current = redis.call('HGET', KEYS[1], 'state') or 'READY'
  local allowed = false
  for s in string.gmatch(ARGV[3], '[^,]+') do
    if s == current then allowed = true end
  end
  if not allowed then
    return 0
  end
end
for field, value in pairs(cjson.decode(ARGV[4])) do
  redis.call('HSET', KEYS[1], field, tostring(value))
end
redis.call('ZADD', KEYS[5], redis.call('INCR', KEYS[4]), ARGV[1])
return 1
