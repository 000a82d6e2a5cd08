-- place: bind a QUEUED job to a node and specific GPUs, starting a new attempt.
-- Fenced by the leader lease: only the controller holding it may place.
-- KEYS[1] job hash     KEYS[2] job event stream   KEYS[3] claims hash (uuid -> job:attempt)
-- KEYS[4] queued zset  KEYS[5] QUEUED set         KEYS[6] SCHEDULED set
-- KEYS[7] node jobs set  KEYS[8] node hash  KEYS[9] node lease  KEYS[10] leader key
-- ARGV[1] job id  ARGV[2] node  ARGV[3] GPU uuids JSON list  ARGV[4] leader value
-- ARGV[5] now  ARGV[6] reason
-- Returns {attempt, ''} on success, {0, why} when the placement is refused.
if redis.call('GET', KEYS[10]) ~= ARGV[4] then
  return {0, 'not the leader'}
end
if redis.call('HGET', KEYS[1], 'state') ~= 'QUEUED' then
  return {0, 'job is not queued'}
end
if redis.call('EXISTS', KEYS[9]) == 0 then
  return {0, 'node is down'}
end
local node_state = redis.call('HGET', KEYS[8], 'state')
if node_state ~= 'READY' then
  return {0, 'node is ' .. tostring(node_state)}
end
local gpus = cjson.decode(ARGV[3])
for _, uuid in ipairs(gpus) do
  if redis.call('HEXISTS', KEYS[3], uuid) == 1 then
    return {0, 'GPU ' .. uuid .. ' is claimed'}
  end
end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
for _, uuid in ipairs(gpus) do
  redis.call('HSET', KEYS[3], uuid, ARGV[1] .. ':' .. attempt)
end
redis.call('HSET', KEYS[1], 'state', 'SCHEDULED', 'node', ARGV[2], 'gpus', ARGV[3],
  'reason', ARGV[6], 'updated_at', ARGV[5], 'scheduled_at', ARGV[5], 'state_since', ARGV[5], 'exit_code', '')
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('SREM', KEYS[5], ARGV[1])
redis.call('SADD', KEYS[6], ARGV[1])
redis.call('SADD', KEYS[7], ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'at', ARGV[5], 'state', 'SCHEDULED',
  'attempt', attempt, 'reason', ARGV[6], 'node', ARGV[2])
return {attempt, ''}
