-- Writes a record when the expectation holds.
-- KEYS[1] values hash (id -> value); KEYS[2] revisions hash (id -> revision);
-- KEYS[3] creation-order zset; KEYS[4] the collection's sequence counter.
-- ARGV: id, value, expectation ('any', 'absent', 'rev'), expected revision.
-- Returns {1, revision} written; {0, current revision or false, current value or false} conflict.
local revision = redis.call('HGET', KEYS[2], ARGV[1])
local holds = ARGV[3] == 'any'
  or (ARGV[3] == 'absent' and not revision)
  or (ARGV[3] == 'rev' and revision == ARGV[4])
if not holds then return { 0, revision, redis.call('HGET', KEYS[1], ARGV[1]) } end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if revision then return { 1, redis.call('HINCRBY', KEYS[2], ARGV[1], 1) } end
redis.call('HSET', KEYS[2], ARGV[1], '1')
redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[4]), ARGV[1])
return { 1, 1 }
