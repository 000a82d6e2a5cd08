-- track_ended: add final jobs missing from the ended zset (jobs that ended before fleet had
-- retention) to it, scored by when they finished, so that retention deletes them too.
-- Fenced by the leader lease: only the controller holding it writes.
-- KEYS[1] ended zset  KEYS[2] leader key
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[2]:
--   <prefix>:job:<id> hashes.
-- ARGV[1] the leader value this write is fenced by  ARGV[2] key prefix  ARGV[3] now
-- ARGV[4] final job states, comma separated  ARGV[5], ARGV[6], ...: job ids
-- Returns the number of jobs added, -2 when ARGV[1] is not the current leader.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -2
end
local final = {}
for s in string.gmatch(ARGV[4], '[^,]+') do
  final[s] = true
end
local added = 0
for i = 5, #ARGV do
  local id = ARGV[i]
  if not redis.call('ZSCORE', KEYS[1], id) then
    local job = redis.call('HMGET', ARGV[2] .. ':job:' .. id, 'state', 'finished_at', 'updated_at')
    if job[1] and final[job[1]] then
      local ended = tonumber(job[2]) or tonumber(job[3]) or tonumber(ARGV[3])
      redis.call('ZADD', KEYS[1], ended, id)
      added = added + 1
    end
  end
end
return added
