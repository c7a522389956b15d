-- One scope's app usage in the current period. KEYS[1]: the period's hash
-- (see app_usage_add.lua). ARGV: now (µs, or '' for Redis's clock), the
-- period ('d', 'w' or 'm'). Returns the hash's fields and values, or
-- nothing when it holds another period.
local now = clock_now(ARGV[1])
local start = period_bounds(ARGV[2], now)
if redis.call('HGET', KEYS[1], 's') ~= int(start) then return {} end
return redis.call('HGETALL', KEYS[1])
