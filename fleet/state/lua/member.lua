-- member: one member of a multi-node job moves along, fenced by the job's attempt.
-- The member on rank r keeps its phase in the job hash field m<r>: starting -> running -> done, or
-- failed (it ended by itself with an error: fleet.agent.members).
-- KEYS[1] job hash
-- ARGV[1] attempt  ARGV[2] rank  ARGV[3] phase: starting | running | done | failed
-- Returns how many members reached that phase ('running' counts members_running, 'done'
-- members_done; 'starting' and 'failed' return 1), or -1 when the attempt is not current or the job is off its
-- nodes, or the member was past that phase already (a second launch or exit of one member).
local cur = redis.call('HMGET', KEYS[1], 'attempt', 'state')
if cur[1] ~= ARGV[1] or (cur[2] ~= 'SCHEDULED' and cur[2] ~= 'STARTING' and cur[2] ~= 'RUNNING') then
  return -1
end
local field = 'm' .. ARGV[2]
local before = redis.call('HGET', KEYS[1], field)
local phase = ARGV[3]
if phase == 'starting' then
  if before then return -1 end
  redis.call('HSET', KEYS[1], field, 'starting')
  return 1
end
if phase == 'running' then
  if before ~= 'starting' then return -1 end
  redis.call('HSET', KEYS[1], field, 'running')
  return redis.call('HINCRBY', KEYS[1], 'members_running', 1)
end
if phase == 'failed' then
  if before == 'done' or before == 'failed' then return -1 end
  redis.call('HSET', KEYS[1], field, 'failed')
  return 1
end
if before == 'done' then return -1 end
redis.call('HSET', KEYS[1], field, 'done')
return redis.call('HINCRBY', KEYS[1], 'members_done', 1)
