-- changed: a job a user changed in the queue (hold, release, update, requeue) is marked in
-- <p>:jobs:changed, scored by a counter, so that the leader reads it again from its last look on even
-- when the message that names it is lost (fleet.keys, fleet.controller.views). The zset keeps the
-- newest CHANGED_KEEP; <p>:jobs:changed:trimmed says up to which version it dropped, and a leader
-- that had not looked that far reads its whole queue again.
local CHANGED_KEEP = 10000

local function mark_changed(prefix, id)
  local feed = prefix .. ':jobs:changed'
  redis.call('ZADD', feed, redis.call('INCR', prefix .. ':jobs:changed:version'), id)
  local over = redis.call('ZCARD', feed) - CHANGED_KEEP
  if over > 0 then
    local last = redis.call('ZRANGE', feed, over - 1, over - 1, 'WITHSCORES')
    redis.call('ZREMRANGEBYRANK', feed, 0, over - 1)
    redis.call('SET', prefix .. ':jobs:changed:trimmed', last[2])
  end
end
