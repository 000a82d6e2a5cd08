-- expire_jobs: delete jobs that ended before a cutoff (retention), with their event stream and the
-- log stream of every attempt, and leave in each one's place a small tombstone that expires itself.
-- Each id is checked again here: it must still be in the ended zset with a score at or before the
-- cutoff, and its record final (or quarantined); an id in the zset whose job is not final is only
-- dropped from the zset. Fenced by the leader lease: only the controller holding it deletes.
-- Its first write is a deletion (ZREM): Redis at maxmemory refuses a script whose first write may
-- grow memory, and this one must run then, to free it. (The tombstones' SET comes after.)
-- KEYS[1] ended zset (id -> end time)  KEYS[2] all-jobs zset  KEYS[3] quarantined jobs hash
-- KEYS[4] queued zset  KEYS[5] leader key
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[2]:
--   <prefix>:job:<id>, <prefix>:job:<id>:events, <prefix>:job:<id>:logs:<1..attempt>[:<rank>],
--   <prefix>:job:<id>:stdin[:bytes] (forwarded input left unread, as a job cancelled while queued),
--   <prefix>:job:<id>:expired (the tombstone), <prefix>:jobs:state:<STATE> sets and the tenant's
--   listing <prefix>:jobs:of:<tenant> (its tenant from the record: lib/ranked.lua); for a task of a
--   job array, <prefix>:array:<array id> (its count of tasks left), and once the array's last task
--   is deleted, that hash, <prefix>:array:<array id>:active and its entry in <prefix>:arrays.
--   A job or array whose record names a function's 'call' lets go of that blob, which goes with
--   the last job or array holding it (lib/blobs.lua).
-- ARGV[1] the leader value this write is fenced by  ARGV[2] key prefix  ARGV[3] cutoff (unix s)
-- ARGV[4] now  ARGV[5] tombstone TTL ms  ARGV[6] final job states, comma separated
-- ARGV[7], ARGV[8], ...: job ids
-- Returns the number of jobs deleted, -2 when ARGV[1] is not the current leader.
--! include ranked
--! include blobs
if redis.call('GET', KEYS[5]) ~= ARGV[1] then
  return -2
end
local prefix, cutoff = ARGV[2], tonumber(ARGV[3])
local final = {}
for s in string.gmatch(ARGV[6], '[^,]+') do
  final[s] = true
end
-- an array record goes with its last task (it holds the spec every task reads)
local function forget_task(array)
  local record = prefix .. ':array:' .. array
  if redis.call('EXISTS', record) == 1 and redis.call('HINCRBY', record, 'left', -1) <= 0 then
    local call = redis.call('HGET', record, 'call')
    if call then blob_release(prefix, call, array) end
    redis.call('DEL', record, record .. ':active')
    redis.call('ZREM', prefix .. ':arrays', array)
  end
end
local deleted = 0
for i = 7, #ARGV do
  local id = ARGV[i]
  local ended = tonumber(redis.call('ZSCORE', KEYS[1], id))
  if ended and ended <= cutoff then
    local job = prefix .. ':job:' .. id
    local fields = redis.call('HMGET', job, 'state', 'attempt', 'finished_at', 'array', 'max_members', 'call')
    local state = fields[1]
    local quarantined = redis.call('HEXISTS', KEYS[3], id) == 1
    redis.call('ZREM', KEYS[1], id)
    if not state or final[state] or quarantined then
      for n = 1, tonumber(fields[2]) or 0 do
        redis.call('DEL', job .. ':logs:' .. n)
        for rank = 1, (tonumber(fields[5]) or 1) - 1 do  -- the other members' streams
          redis.call('DEL', job .. ':logs:' .. n .. ':' .. rank)
        end
      end
      ranked_remove(prefix, id)  -- never there once final: only a record damaged while queued
      local _, _, tenant = rank_of(prefix, id)
      if tenant then redis.call('ZREM', prefix .. ':jobs:of:' .. tenant, id) end
      redis.call('DEL', job, job .. ':events', job .. ':stdin', job .. ':stdin:bytes')
      if fields[6] then blob_release(prefix, fields[6], id) end
      if state then
        redis.call('SREM', prefix .. ':jobs:state:' .. state, id)
        if quarantined then state = 'QUARANTINED' end
        local tombstone = cjson.encode({state = state, ended_at = fields[3] or tostring(ended),
                                        expired_at = ARGV[4]})
        redis.call('SET', job .. ':expired', tombstone, 'PX', ARGV[5])
        deleted = deleted + 1
      end
      redis.call('ZREM', KEYS[2], id)
      redis.call('ZREM', KEYS[4], id)
      redis.call('HDEL', KEYS[3], id)
      if state and fields[4] then
        forget_task(fields[4])
      end
    end
  end
end
return deleted
