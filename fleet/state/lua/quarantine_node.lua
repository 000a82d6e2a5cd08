-- quarantine_node: record (or, once readable again, forget) why a node record cannot be read.
-- Readers skip an unreadable node record whether or not it is recorded here; this hash tells
-- operators why (`fleet nodes show`), and lets the controller log each quarantine once.
-- KEYS[1] quarantined nodes hash (name -> reason)  KEYS[2] leader key
-- ARGV[1] node name  ARGV[2] reason, '' to forget the node's entry
-- ARGV[3] the leader value this controller write is fenced by
-- Returns 1 when the entry was added (or removed), 0 when there was nothing to do,
-- -2 when ARGV[3] is not the current leader.
if redis.call('GET', KEYS[2]) ~= ARGV[3] then
  return -2
end
if ARGV[2] == '' then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
