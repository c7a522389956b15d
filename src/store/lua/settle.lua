-- Records a request's real cost and releases its reservation, once per
-- reservation id: a retried settlement records nothing more.
-- ARGV: now, day start, week start, month start, reservation id, cost,
--       byok (0/1), how long (µs) a settled id is remembered
-- KEYS[5]: settled ids, scored by when they may be forgotten.
local now = tonumber(ARGV[1])
drop_expired(now)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', int(now))
if redis.call('ZSCORE', KEYS[5], ARGV[5]) then return 0 end
local memory = tonumber(ARGV[8])
redis.call('ZADD', KEYS[5], int(now + memory), ARGV[5])
redis.call('PEXPIRE', KEYS[5], math.ceil(memory / 1000))
redis.call('HDEL', KEYS[4], ARGV[5])
redis.call('ZREM', KEYS[3], ARGV[5])
local cost = ARGV[6]
local byok = ARGV[7] == '1'
local names = { { 'ds', 'd', 'bd' }, { 'ws', 'w', 'bw' }, { 'ms', 'm', 'bm' } }
local stored = redis.call('HMGET', KEYS[2], 'ds', 'ws', 'ms')
for p = 1, 3 do
  -- Periods only roll forward: a cost stamped in a period that has already
  -- rolled over (a clock a moment behind) counts in the all-time totals only.
  local start = tonumber(ARGV[1 + p])
  local current = tonumber(stored[p] or '')
  if current == nil or start > current then
    redis.call('HSET', KEYS[2], names[p][1], ARGV[1 + p], names[p][2], '0', names[p][3], '0')
    current = start
  end
  if start == current then
    redis.call('HINCRBY', KEYS[2], byok and names[p][3] or names[p][2], cost)
  end
end
redis.call('HINCRBY', KEYS[2], byok and 'bt' or 't', cost)
-- '-0' is not an integer to Redis, so a zero cost skips the balance.
if not byok and cost ~= '0' then redis.call('HINCRBY', KEYS[1], 'balance', '-' .. cost) end
return 1
