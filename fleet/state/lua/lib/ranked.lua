-- ranked: the queue and its per-tenant index, included by every script that queues or unqueues a
-- job. <p>:jobs:queued holds every QUEUED job scored by rank (higher priority first, then
-- submission: (1000 - priority) * 2^40 + seq), <p>:queue:<tenant> a tenant's, and
-- <p>:queue:@tenants the tenants with queued jobs: a job's place in line is a ZRANK, not a read
-- of every queued spec. A job's hash holds 'queue' = "<priority> <tenant>" (a task of a job array:
-- its array's hash). A job stored by a version before the index has no 'queue' field: it is queued
-- by seq alone (below 2^40, so ahead of everyone) until the leader's resync repairs it
-- (ranked_repair.lua).
local RANK_UNIT = 1099511627776  -- 2^40: seq stays below it, priority is -1000..1000

local function rank_of(prefix, id)
  local f = redis.call('HMGET', prefix .. ':job:' .. id, 'seq', 'queue', 'array')
  if f[3] then
    f[2] = redis.call('HGET', prefix .. ':array:' .. f[3], 'queue')
  end
  local seq = tonumber(f[1] or '')
  local priority, tenant = string.match(f[2] or '', '^(%-?%d+) (.+)$')
  if not seq then
    return nil, nil, tenant
  end
  if not priority then
    return string.format('%d', seq), nil, nil
  end
  -- %d: Lua would print a plain number with 14 digits, and the score needs up to 16
  return string.format('%d', (1000 - tonumber(priority)) * RANK_UNIT + seq), seq, tenant
end

-- The record that holds a job's 'queue' field (a task's: its array's), that field, and for a record
-- stored before the index, the field made from its spec and written; nil from a record that does
-- not exist or cannot be read (the controller quarantines it). Never creates a record.
local function queue_field(prefix, id)
  local key = prefix .. ':job:' .. id
  local array = redis.call('HGET', key, 'array')
  if array then key = prefix .. ':array:' .. array end
  local f = redis.call('HMGET', key, 'queue', 'spec')
  if f[1] or not f[2] then return f[1] end
  local ok, spec = pcall(cjson.decode, f[2])
  if not ok or type(spec) ~= 'table' then return nil end
  local queue = string.format('%d', math.floor(tonumber(spec.priority) or 0)) .. ' ' .. tostring(spec.tenant or 'default')
  redis.call('HSET', key, 'queue', queue)
  return queue
end

local function ranked_add(prefix, id)
  local score, _, tenant = rank_of(prefix, id)
  if not score then
    return
  end
  redis.call('ZADD', prefix .. ':jobs:queued', score, id)
  if tenant then
    redis.call('ZADD', prefix .. ':queue:' .. tenant, score, id)
    redis.call('SADD', prefix .. ':queue:@tenants', tenant)
  end
end

local function unrank(prefix, tenant, id)
  local queue = prefix .. ':queue:' .. tenant
  if redis.call('ZREM', queue, id) == 1 and redis.call('ZCARD', queue) == 0 then
    redis.call('SREM', prefix .. ':queue:@tenants', tenant)
  end
end

local function ranked_remove(prefix, id)
  if redis.call('ZREM', prefix .. ':jobs:queued', id) == 0 then
    return
  end
  local _, _, tenant = rank_of(prefix, id)
  if tenant then
    unrank(prefix, tenant, id)
  end
end
