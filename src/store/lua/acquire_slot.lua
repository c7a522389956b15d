-- Takes one of `limit` in-flight slots for a holder, as a lease that ends by itself.
-- KEYS[1]: the slot set, a sorted set of holder -> when its lease ends (µs).
-- ARGV: now (µs), holder, limit, lease end (µs), TTL slack (ms)
-- Returns {acquired, held, retry_after µs}.
-- Scores are doubles, exact while lease ends stay below 2^53 µs (the year
-- 2255).
local key = KEYS[1]
local now = tonumber(ARGV[1])
local holder = ARGV[2]
local limit = tonumber(ARGV[3])
local slack_ms = tonumber(ARGV[5])

-- A lease ending at `t` is held while `now < t`: a crashed holder's slot
-- frees itself when its lease ends.
redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
local renewing = redis.call('ZSCORE', key, holder)
local held = redis.call('ZCARD', key)
if not renewing and held >= limit then
  local earliest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return { 0, held, tonumber(earliest[2]) - now }
end
redis.call('ZADD', key, ARGV[4], holder)
if not renewing then held = held + 1 end
-- The set lives as long as its longest lease (a renewal may have shortened
-- this one), plus slack for callers whose clocks read a little earlier.
local latest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', key, int(math.ceil((tonumber(latest[2]) - now) / 1000) + slack_ms))
return { 1, held, 0 }
