-- progress: keep a job's last progress report, fenced by its attempt: a report from an attempt that
-- is no longer the job's latest (a stale one, still shipping) changes nothing.
-- KEYS[1] job hash
-- ARGV[1] the attempt the report comes from  ARGV[2] the report (JSON: Progress and its attempt)
-- Returns 1 when kept, 0 when the attempt is not the latest (or there is no such job).
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'progress', ARGV[2])
return 1
