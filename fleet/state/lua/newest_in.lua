-- newest_in: the newest jobs in a state (read only), from a listing: every job's (<prefix>:jobs)
-- or one tenant's (<prefix>:jobs:of:<tenant>), both scored by seq. ZINTER walks the smaller of the
-- two and returns them by score, so this costs the jobs in that state (or the tenant's), in Redis,
-- and sends back only the newest.
-- KEYS[1] listing zset (id -> seq)  KEYS[2] the state's set
-- ARGV[1] how many
-- Returns {id, seq, id, seq, ...} newest first, at most ARGV[1] of them.
local both = redis.call('ZINTER', 2, KEYS[1], KEYS[2], 'WEIGHTS', 1, 0, 'WITHSCORES')
local out, most = {}, 2 * tonumber(ARGV[1])
for i = #both - 1, 1, -2 do
  if #out >= most then break end
  out[#out + 1] = both[i]
  out[#out + 1] = both[i + 1]
end
return out
