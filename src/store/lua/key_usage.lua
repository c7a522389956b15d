-- A key's usage in the current periods and its live reservations.
-- KEYS: account hash, usage hash, reservations zset, amounts hash, the
-- zset of ids settled without a granted hold and of lapsed holds.
-- ARGV: now (µs, or '' for Redis's clock), how long (µs) past its expiry
-- a lapsed hold is kept.
-- Returns the eight usage fields and the reserved sum, as decimal strings.
local now = clock_now(ARGV[1])
local k = { use = KEYS[2], res = KEYS[3], amt = KEYS[4], settled = KEYS[5], lapse = tonumber(ARGV[2]) }
drop_expired(k, now)
local reserved = live_reserved(k)
local starts = period_starts(now)
local f = redis.call('HMGET', k.use, unpack(USAGE_FIELDS))
local usage = {}
for p = 0, 3 do
  local own, byok = usage_in(f, 0, p, starts)
  table.insert(usage, own)
  table.insert(usage, byok)
end
table.insert(usage, big_str(reserved))
return usage
