-- Admission: reject on the key limit or a negative balance, else hold the amount.
-- ARGV: now, day start, week start, month start, reservation id, amount,
--       expires at (µs), key TTL (ms), has limit (0/1), limit,
--       reset ('n' never, 'd', 'w', 'm'), include BYOK (0/1), check balance (0/1)
-- Returns {0, used, reserved} reserved; {1, used with reservations} over the
-- key limit; {2, balance} balance negative. Amounts are decimal strings.
local now = tonumber(ARGV[1])
local reserved = live_reserved(now)
local usage = usage_fields({ ARGV[2], ARGV[3], ARGV[4] })
local offset = ({ n = 1, d = 3, w = 5, m = 7 })[ARGV[11]]
local used = big(usage[offset])
if ARGV[12] == '1' then used = big_add(used, big(usage[offset + 1])) end
local committed = big_add(used, reserved)
-- Refused when this request could take usage past the limit; a free one
-- (amount 0) when usage has reached it.
if ARGV[9] == '1' then
  local limit = big(ARGV[10])
  local over
  if ARGV[6] == '0' then
    over = big_ge(committed, limit)
  else
    over = not big_ge(limit, big_add(committed, big(ARGV[6])))
  end
  if over then return { 1, big_str(committed) } end
end
if ARGV[13] == '1' then
  local balance = redis.call('HGET', KEYS[1], 'balance') or '0'
  if string.sub(balance, 1, 1) == '-' then return { 2, balance } end
end
local previous = redis.call('HGET', KEYS[4], ARGV[5])
-- The same id reserved again replaces its earlier amount.
if previous then reserved = big_sub(reserved, big(previous)) end
redis.call('HSET', KEYS[4], ARGV[5], ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[5])
-- Only ever extend the keys' lifetime: a shorter TTL must not cut a longer reservation.
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[8]) then
  redis.call('PEXPIRE', KEYS[3], ARGV[8])
  redis.call('PEXPIRE', KEYS[4], ARGV[8])
end
return { 0, big_str(used), big_str(big_add(reserved, big(ARGV[6]))) }
