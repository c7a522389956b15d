-- Writes a record when the expectation holds.
-- KEYS[1] record hash {id, v, rev}; KEYS[2] creation-order zset of escaped ids;
-- KEYS[3] the collection's sequence counter.
-- ARGV: escaped id, value, expectation ('any', 'absent', 'rev'), expected revision, id.
-- Returns {1, revision} written; {0, current revision or false, current value or false} conflict.
local current = redis.call('HMGET', KEYS[1], 'rev', 'v')
local revision = current[1]
local holds = ARGV[3] == 'any'
  or (ARGV[3] == 'absent' and not revision)
  or (ARGV[3] == 'rev' and revision == ARGV[4])
if not holds then return { 0, revision, current[2] } end
if revision then
  redis.call('HSET', KEYS[1], 'v', ARGV[2])
  return { 1, redis.call('HINCRBY', KEYS[1], 'rev', 1) }
end
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1])
redis.call('HSET', KEYS[1], 'id', ARGV[5], 'v', ARGV[2], 'rev', '1')
return { 1, 1 }
