#!lua flags=allow-oom
-- leader: acquire or renew the controller leader lease (SET NX PX with a fencing token).
-- allow-oom (Redis >= 7.0): at maxmemory Redis refuses writes, but a leader must still lead, to
-- delete the expired jobs that free memory; this writes three small keys, mostly overwriting them.
-- KEYS[1] leader key  KEYS[2] fencing token counter  KEYS[3] the leader's release (expires with the lease)
-- ARGV[1] controller id  ARGV[2] lease TTL ms  ARGV[3] the value this controller holds, '' if none
-- ARGV[4] this controller's release
-- Returns the leader value ("<id>:<token>") this controller now holds, or '' when another leads.
local current = redis.call('GET', KEYS[1])
if not current then
  local token = redis.call('INCR', KEYS[2])
  local value = ARGV[1] .. ':' .. token
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
  redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[2])
  return value
end
if current == ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[2])
  return current
end
return ''
