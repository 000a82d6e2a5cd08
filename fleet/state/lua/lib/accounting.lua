-- accounting: the usage rows `fleet history` reads, kept after retention deletes the jobs.
-- While a job lives, its hash counts what its attempts used: 'acct_run_s' (seconds RUNNING),
-- 'acct_gpu_s' and 'acct_cpu_s' (those seconds times the GPUs and the CPUs granted), summed over
-- every attempt (requeues and an elastic job's resizes included), and 'acct_started' (when it first
-- ran). When it ends, one row (JSON) goes to <p>:acct:<day> (a hash: job id -> row; day = floor(end
-- time / 86400)), the day to <p>:acct:days (a zset scored by day), in the same script as the move
-- to the final state: a retried call that is refused as stale writes nothing twice. A job that ends
-- again (a failed array task run again) has its earlier row ('acct_day') replaced by one with the
-- totals. The leader deletes days older than accounting_retention_s (fleet.state.accounting).
local ACCT_DAY = 86400

-- The attempt of job ``id`` (hash ``key``) leaves its nodes ``parts`` ({{node, {uuids}}, ...}) from
-- ``state`` at ``now``: count its time if it was RUNNING (before its node's alloc entry goes).
local function acct_attempt(prefix, key, id, state, now, parts)
  if state ~= 'RUNNING' then return end
  local f = redis.call('HMGET', key, 'run_from', 'started_at')
  local from = tonumber(f[1] or '') or tonumber(f[2] or '')
  if not from then return end
  local ran = math.max(tonumber(now) - from, 0)
  local gpus, cpus = 0, 0
  for _, part in ipairs(parts) do
    gpus = gpus + #part[2]
    local alloc = redis.call('HGET', prefix .. ':node:' .. part[1] .. ':alloc', id) or ''
    cpus = cpus + (tonumber(string.match(alloc, '^(%S+)') or '') or 0)
  end
  redis.call('HINCRBYFLOAT', key, 'acct_run_s', ran)
  redis.call('HINCRBYFLOAT', key, 'acct_gpu_s', ran * gpus)
  redis.call('HINCRBYFLOAT', key, 'acct_cpu_s', ran * cpus)
  redis.call('HSETNX', key, 'acct_started', tostring(from))
end

local function acct_spec(text)
  local ok, spec = pcall(cjson.decode, text or '')
  if ok and type(spec) == 'table' then return spec end
  return {}
end

-- Job ``id`` has just moved to final ``state`` at ``now``: write its row.
local function acct_final(prefix, id, state, now)
  local key = prefix .. ':job:' .. id
  local f = redis.call('HMGET', key, 'spec', 'array', 'index', 'owner', 'created_at', 'acct_started',
    'attempt', 'num_gpus', 'acct_run_s', 'acct_gpu_s', 'acct_cpu_s', 'acct_day')
  local spec, owner, name = nil, f[4] or '', nil
  if f[2] then
    local array = redis.call('HMGET', prefix .. ':array:' .. f[2], 'spec', 'owner')
    spec, owner = acct_spec(array[1]), array[2] or ''
    name = tostring(spec.name or '') .. '[' .. tostring(f[3] or '') .. ']'
  else
    spec = acct_spec(f[1])
    name = tostring(spec.name or '')
  end
  local gpus = tonumber(f[8] or '') or 0
  if type(spec.gpus) == 'number' then gpus = spec.gpus end
  local day = math.floor(tonumber(now) / ACCT_DAY)
  local row = cjson.encode({
    id = id, tenant = tostring(spec.tenant or 'default'), user = owner, name = name, state = state,
    gpus = gpus, attempts = tonumber(f[7] or '') or 0,
    submitted_at = tonumber(f[5] or '') or 0, started_at = tonumber(f[6] or '') or cjson.null,
    ended_at = tonumber(now), run_s = tonumber(f[9] or '') or 0, gpu_s = tonumber(f[10] or '') or 0,
    cpu_s = tonumber(f[11] or '') or 0,
  })
  if f[12] and f[12] ~= tostring(day) then
    redis.call('HDEL', prefix .. ':acct:' .. f[12], id)
  end
  redis.call('HSET', prefix .. ':acct:' .. day, id, row)
  redis.call('ZADD', prefix .. ':acct:days', day, day)
  redis.call('HSET', key, 'acct_day', tostring(day))
end
