-- blob_use: whether a blob is stored and one of the given tenants uploaded it (that upload still
-- counted against the tenant's blob_quota_bytes); if so, keep the blob, its size and that tenant's
-- upload another TTL (a blob held by jobs, lib/blobs.lua, has none to extend). Anything else
-- changes nothing, so a blob only another tenant uploaded answers as one never uploaded. With no
-- tenant given (a service's use), only whether it is stored, and kept so.
-- KEYS[1] <prefix>:blob:<hex>  KEYS[2] <prefix>:blobsize:<hex>  KEYS[3] <prefix>:blob:<hex>:jobs
-- KEYS[4], KEYS[5], ...: <prefix>:blobs:of:<tenant> of each tenant that may use it
-- ARGV[1] the blob's hex digest  ARGV[2] TTL ms  ARGV[3] now (unix ms)
-- Returns 1 when it is stored and one of the tenants uploaded it, else 0.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local ttl, now = tonumber(ARGV[2]), tonumber(ARGV[3])
local function keep()
  if redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
  return 1
end
if #KEYS == 3 then
  return keep()
end
for i = 4, #KEYS do
  local held = redis.call('HGET', KEYS[i], ARGV[1])
  local size, expires = string.match(held or '', '^(%d+) (%d+)$')
  if size and tonumber(expires) > now then
    redis.call('HSET', KEYS[i], ARGV[1], size .. ' ' .. string.format('%d', now + ttl))
    redis.call('PEXPIRE', KEYS[i], ttl)
    return keep()
  end
end
return 0
