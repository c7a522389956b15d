-- Checks every counter, then adds to all of them or to none.
-- KEYS: two per check (see counters.lua).
-- ARGV[1]: now (µs), or '' for Redis's clock; ARGV[2]: TTL slack (ms);
-- then four per check (see counters.lua).
-- Returns {admitted, now, then per check: fits, used, remaining,
-- retry_after µs, reset_after µs}.
local now = clock_now(ARGV[1])
local all, states = counters_check(now, #KEYS / 2, 0, 2, {})
if all then counters_commit(now, tonumber(ARGV[2]), states) end
local result = { all and 1 or 0, int(now) }
counters_outcomes(states, result, 5)
return result
