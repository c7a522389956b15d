-- Admission: reject on the key limit or a negative balance, else hold the amount.
-- ARGV: now, day start, week start, month start, reservation id, amount,
--       expires at (µs), key TTL (ms), has limit (0/1), limit,
--       reset ('n' never, 'd', 'w', 'm'), include BYOK (0/1), check balance (0/1)
-- Returns {0, used, reserved} reserved; {1, used with reservations} over the
-- key limit; {2, balance} balance negative.
local now = tonumber(ARGV[1])
local reserved = live_reserved(now)
local usage = usage_fields({ ARGV[2], ARGV[3], ARGV[4] })
local offset = ({ n = 1, d = 3, w = 5, m = 7 })[ARGV[11]]
local used = tonumber(usage[offset])
if ARGV[12] == '1' then used = used + tonumber(usage[offset + 1]) end
if ARGV[9] == '1' and used + reserved >= tonumber(ARGV[10]) then
  return { 1, used + reserved }
end
if ARGV[13] == '1' then
  local balance = redis.call('HGET', KEYS[1], 'balance') or '0'
  if tonumber(balance) < 0 then return { 2, balance } end
end
local previous = tonumber(redis.call('HGET', KEYS[4], ARGV[5]) or '0')
redis.call('HSET', KEYS[4], ARGV[5], ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[5])
-- Only ever extend the keys' lifetime: a shorter TTL must not cut a longer reservation.
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[8]) then
  redis.call('PEXPIRE', KEYS[3], ARGV[8])
  redis.call('PEXPIRE', KEYS[4], ARGV[8])
end
return { 0, used, reserved - previous + tonumber(ARGV[6]) }
