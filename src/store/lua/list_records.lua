-- A newest-first page of the records live now.
-- KEYS: the collection's five keys (records_common.lua).
-- ARGV: first and last rank (inclusive), worked out by the caller; now
-- (µs, or '' for Redis's clock).
-- Returns {id, value, revision, id, value, revision, ...}.
purge_expired(clock_now(ARGV[3]))
local out = {}
for _, id in ipairs(redis.call('ZREVRANGE', KEYS[3], ARGV[1], ARGV[2])) do
  table.insert(out, id)
  table.insert(out, redis.call('HGET', KEYS[1], id))
  table.insert(out, redis.call('HGET', KEYS[2], id))
end
return out
