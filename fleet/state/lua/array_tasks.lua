-- array_tasks: how the tasks of a job array stand (read only): tasks per state, the first FAILED.
-- Counting where the tasks are keeps no counter that every transition would have to update.
-- Derived keys (fleet runs on one Redis or a Sentinel pair, never Cluster), from ARGV[1]:
--   <prefix>:job:<task id> hashes.
-- ARGV[1] key prefix  ARGV[2] array id  ARGV[3] indices in normal form ("0-9999", "1,3,5-9")
-- ARGV[4] most FAILED task ids to return
-- Returns a JSON object: {"counts": {state: tasks}, "failed": [task ids, lowest index first]};
-- a task that no longer exists counts under the state "".
local base = ARGV[1] .. ':job:' .. ARGV[2] .. '-'
local shown = tonumber(ARGV[4])
local counts, failed = {}, {}
local function count(index)
  local state = redis.call('HGET', base .. index, 'state') or ''
  counts[state] = (counts[state] or 0) + 1
  if state == 'FAILED' and #failed < shown then
    failed[#failed + 1] = ARGV[2] .. '-' .. index
  end
end
for run in string.gmatch(ARGV[3], '[^,]+') do
  local first, last = string.match(run, '^(%d+)-(%d+)$')
  if not first then
    first, last = run, run
  end
  for index = tonumber(first), tonumber(last) do
    count(index)
  end
end
-- cjson writes an empty table as {}: readers take an empty "failed" of either kind
return cjson.encode({counts = counts, failed = failed})
