-- A record. KEYS[1] values hash, KEYS[2] revisions hash, KEYS[3] expiries
-- zset (records_common.lua). ARGV: id, now (µs, or '' for Redis's clock).
-- Returns {value or false, revision or false}: false for an expired one.
local expires = redis.call('ZSCORE', KEYS[3], ARGV[1])
if expires and tonumber(expires) <= clock_now(ARGV[2]) then return { false, false } end
return { redis.call('HGET', KEYS[1], ARGV[1]), redis.call('HGET', KEYS[2], ARGV[1]) }
