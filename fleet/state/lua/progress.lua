-- progress: keep a job's last progress report, fenced by its attempt: a report from an attempt that
-- is no longer the job's latest (a stale one, still shipping) changes nothing. An elastic job's
-- samples/s is folded into what is known of its size now (field 'speeds', "<GPUs>x<batch>": an
-- average in which each report weighs 30 %), the size fleet launched the attempt at (or, for one that
-- follows a batch change while it runs, last changed it to), not one the job claims: a report of
-- another batch (one made before the job took up the new one) is not folded in; at most 32 sizes are
-- kept. Its gradient noise scale, when the report has one, is kept as
-- field 'gns' (the job smooths it itself), across attempts: a new attempt starts from the last one.
-- KEYS[1] job hash
-- ARGV[1] the attempt the report comes from  ARGV[2] the report (JSON: Progress and its attempt)
-- ARGV[3] the samples/s it reported ('' if none)  ARGV[4] its gradient noise scale ('' if none)
-- ARGV[5] the global batch it says it ran at, from one that follows a batch change ('' otherwise)
-- Returns 1 when kept, 0 when the attempt is not the latest (or there is no such job).
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'progress', ARGV[2])
local gns = tonumber(ARGV[4])
if gns and gns > 0 and gns < 1e15 then
  redis.call('HSET', KEYS[1], 'gns', ARGV[4])
end
local rate = tonumber(ARGV[3])
local size = redis.call('HMGET', KEYS[1], 'num_gpus', 'batch_size')
local claimed = tonumber(ARGV[5] or '')
local current = tonumber(size[1] or '0') > 0 and (not claimed or claimed == tonumber(size[2] or '0'))
if rate and rate > 0 and rate < 1e15 and current then
  local stored = redis.call('HGET', KEYS[1], 'speeds')
  local ok, speeds = pcall(cjson.decode, stored or '{}')
  if not ok or type(speeds) ~= 'table' then speeds = {} end  -- unreadable: start again
  local key = size[1] .. 'x' .. (size[2] or '0')
  local old = speeds[key]
  if old then
    speeds[key] = 0.7 * old + 0.3 * rate
  else
    local n = 0
    for _ in pairs(speeds) do n = n + 1 end
    if n < 32 then speeds[key] = rate end
  end
  redis.call('HSET', KEYS[1], 'speeds', cjson.encode(speeds))
end
return 1
