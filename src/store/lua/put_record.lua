-- Writes a record when the expectation holds (and, creating one, while
-- the collection holds fewer live records than the cap).
-- KEYS: the collection's five keys (records_common.lua).
-- ARGV: id, value, expectation ('any', 'absent', 'rev'), expected revision,
-- now (µs, or '' for Redis's clock), lifetime (µs, or '' for none), most
-- live records (or '' for no cap), key expiry slack (ms).
-- Returns {1, revision} written; {0, current revision or false, current
-- value or false} conflict; {2, live records} full.
local now = clock_now(ARGV[5])
purge_expired(now)
local revision = redis.call('HGET', KEYS[2], ARGV[1])
local holds = ARGV[3] == 'any'
  or (ARGV[3] == 'absent' and not revision)
  or (ARGV[3] == 'rev' and revision == ARGV[4])
if not holds then return { 0, revision, redis.call('HGET', KEYS[1], ARGV[1]) } end
if not revision and ARGV[7] ~= '' then
  local live = redis.call('HLEN', KEYS[2])
  if live >= tonumber(ARGV[7]) then return { 2, live } end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[6] ~= '' then
  redis.call('ZADD', KEYS[5], int(now + tonumber(ARGV[6])), ARGV[1])
else
  redis.call('ZREM', KEYS[5], ARGV[1])
end
local written = 1
if revision then
  written = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
else
  redis.call('HSET', KEYS[2], ARGV[1], '1')
  redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[4]), ARGV[1])
end
set_lifetime(now, tonumber(ARGV[8]))
return { 1, written }
