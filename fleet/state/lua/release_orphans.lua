-- release_orphans: delete GPU claims that no current attempt holds (left behind by a crash between
-- writes of an older version, a hand edit, a bug), so their GPUs are not lost forever. Each claim
-- is deleted only if it still names the same holder and that job is not on a node at that
-- attempt now: a claim made after the caller's snapshot is never touched.
-- Fenced by the leader lease: only the controller holding it may release.
-- KEYS[1] claims hash (uuid -> "<job id>:<attempt>")  KEYS[2] leader key
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[2]:
--   <prefix>:job:<id> hashes.
-- ARGV[1] the leader value this write is fenced by  ARGV[2] key prefix
-- ARGV[3] on-node job states, comma separated
-- ARGV[4], ARGV[5], ...: pairs of GPU uuid and the holder the caller saw
-- Returns the number of claims deleted, -2 when ARGV[1] is not the current leader.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -2
end
local on_node = {}
for s in string.gmatch(ARGV[3], '[^,]+') do
  on_node[s] = true
end
local deleted = 0
for i = 4, #ARGV - 1, 2 do
  local uuid, holder = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', KEYS[1], uuid) == holder then
    local id, attempt = string.match(holder, '^(.*):(%d+)$')
    local held = false
    if id then
      local job = redis.call('HMGET', ARGV[2] .. ':job:' .. id, 'state', 'attempt')
      held = job[1] and on_node[job[1]] and job[2] == attempt
    end
    if not held then
      redis.call('HDEL', KEYS[1], uuid)
      deleted = deleted + 1
    end
  end
end
return deleted
