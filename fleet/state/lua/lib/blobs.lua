-- blobs: a function's call (an uploaded blob, <p>:blob:<hex>) is held by the jobs and job arrays
-- whose spec names it, so it lives as long as they do and goes with the last of them: their ids are
-- in <p>:blob:<hex>:jobs, and while that set exists the blob and <p>:blobsize:<hex> have no TTL (an
-- upload or a submit naming it then extends nothing: blob_use.lua). Included by the scripts that
-- create jobs (submit.lua, submit_array.lua) and by the one that deletes them (expire_jobs.lua).
local function blob_hold(prefix, hex, holder)
  local blob = prefix .. ':blob:' .. hex
  redis.call('SADD', blob .. ':jobs', holder)
  redis.call('PERSIST', blob)
  redis.call('PERSIST', prefix .. ':blobsize:' .. hex)
end

local function blob_release(prefix, hex, holder)
  local blob = prefix .. ':blob:' .. hex
  redis.call('SREM', blob .. ':jobs', holder)
  if redis.call('EXISTS', blob .. ':jobs') == 0 then
    redis.call('DEL', blob, prefix .. ':blobsize:' .. hex)
  end
end
