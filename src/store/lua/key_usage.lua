-- A key's usage in the current periods and its live reservations.
-- KEYS: account hash, usage hash, reservations zset, amounts hash.
-- ARGV: now, day start, week start, month start
-- Returns the eight usage fields and the reserved sum, as decimal strings.
local k = { use = KEYS[2], res = KEYS[3], amt = KEYS[4] }
drop_expired(k, tonumber(ARGV[1]))
local reserved = live_reserved(k)
local usage = usage_fields(k, { ARGV[2], ARGV[3], ARGV[4] })
table.insert(usage, big_str(reserved))
return usage
