-- A key's usage in the current periods and its live reservations.
-- ARGV: now, day start, week start, month start
-- Returns the eight usage fields and the reserved sum, as decimal strings.
local reserved = live_reserved(tonumber(ARGV[1]))
local usage = usage_fields({ ARGV[2], ARGV[3], ARGV[4] })
table.insert(usage, big_str(reserved))
return usage
