-- Deletes a record when the expectation holds.
-- KEYS: the collection's five keys (records_common.lua).
-- ARGV: id, expectation ('any', 'absent', 'rev'), expected revision, now
-- (µs, or '' for Redis's clock), key expiry slack (ms).
-- Returns {1, 0} deleted (or nothing to delete); conflicts as put_record.
local now = clock_now(ARGV[4])
purge_expired(now)
local revision = redis.call('HGET', KEYS[2], ARGV[1])
local holds = ARGV[2] == 'any'
  or (ARGV[2] == 'absent' and not revision)
  or (ARGV[2] == 'rev' and revision == ARGV[3])
if not holds then return { 0, revision, redis.call('HGET', KEYS[1], ARGV[1]) } end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
set_lifetime(now, tonumber(ARGV[5]))
return { 1, 0 }
