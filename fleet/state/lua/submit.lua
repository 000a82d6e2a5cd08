-- submit: create a job unless its id exists (idempotent submit with a caller-chosen id).
-- The submit itself is not written to the job's event stream: history starts from created_at
-- (a stream holds at least one node of stream-node-max-bytes, 1 to 4 KB, even with one entry, and
-- most of a deep queue is jobs that have not run yet).
-- KEYS[1] job hash        KEYS[2] seq counter     KEYS[3] all-jobs zset
-- KEYS[4] queued zset (lib/ranked.lua writes it)  KEYS[5] QUEUED set
-- KEYS[6] the id's tombstone (a job by this id ended and was deleted by retention)
-- KEYS[7] the array hash with this id (job and array ids share one name space)
-- ARGV[1] job id  ARGV[2] spec JSON  ARGV[3] now (unix s)  ARGV[4] reason
-- ARGV[5] owner: the user who submitted it ('' when unknown)
-- ARGV[6] "<priority> <tenant>" (its place in the queue: lib/ranked.lua)  ARGV[7] key prefix
-- ARGV[8] its tenant: the job joins <prefix>:jobs:of:<tenant> too (a tenant's listing)
-- ARGV[9] the hex digest of a function's call ('' for none): the job holds that blob
--   (lib/blobs.lua; derived keys <prefix>:blob:<hex>, :jobs, <prefix>:blobsize:<hex>) and its hash
--   names it as 'call', for expire_jobs.lua
-- Fields that start at their default (failures, not_before, updated_at, ...) are not stored: a job
-- queued costs its hash, and every field of a hash of this size is ~50 bytes.
-- Returns 1 when created, 0 when a job with this id already existed, -1 while the tombstone of
-- an expired job holds the id (a new job must not inherit its checkpoint directory), -2 when a
-- job array has this id.
--! include ranked
--! include blobs
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if redis.call('EXISTS', KEYS[6]) == 1 then
  return -1
end
if redis.call('EXISTS', KEYS[7]) == 1 then
  return -2
end
local seq = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'spec', ARGV[2], 'state', 'QUEUED', 'attempt', 0,
  'created_at', ARGV[3], 'reason', ARGV[4], 'seq', seq, 'owner', ARGV[5], 'queue', ARGV[6])
redis.call('ZADD', KEYS[3], seq, ARGV[1])
redis.call('ZADD', ARGV[7] .. ':jobs:of:' .. ARGV[8], seq, ARGV[1])
redis.call('SADD', KEYS[5], ARGV[1])
ranked_add(ARGV[7], ARGV[1])
if ARGV[9] ~= '' then
  redis.call('HSET', KEYS[1], 'call', ARGV[9])
  blob_hold(ARGV[7], ARGV[9], ARGV[1])
end
return 1
