-- Every write to one account's usage ledger: settles any number of its
-- requests, then, when asked, decides a reservation, all as one atomic
-- step. So a reservation can carry the settlements waiting for its
-- account, and settlements can go together, in one round trip.
-- KEYS[1]: the account hash; then four keys per key ledger: usage hash,
-- reservations zset, amounts hash, settled ids zset.
-- ARGV: now, day start, week start, month start, how long (µs) a settled
--   id is remembered, settlement count N; then N times: ledger (1-based
--   index of its four keys), reservation id, cost, byok (0/1); then, when
--   a reservation follows: ledger, reservation id, amount, expires at (µs),
--   key TTL (ms), has limit (0/1), limit, reset ('n' never, 'd', 'w', 'm'),
--   include BYOK (0/1), check balance (0/1).
-- Returns, with a reservation, {0, used, reserved} reserved; {1, used with
-- reservations} over the key limit; {2, balance} balance negative (amounts
-- as decimal strings). Without one, how many settlements were new.
local now = tonumber(ARGV[1])
local starts = { ARGV[2], ARGV[3], ARGV[4] }
local memory = tonumber(ARGV[5])

-- Each key ledger once per call: its expired reservations dropped.
local ledgers = {}
local function ledger(index)
  local k = ledgers[index]
  if k then return k end
  local base = 1 + (tonumber(index) - 1) * 4
  k = { use = KEYS[base + 1], res = KEYS[base + 2], amt = KEYS[base + 3], settled = KEYS[base + 4] }
  drop_expired(k, now)
  ledgers[index] = k
  return k
end

-- Records a request's real cost and releases its reservation, once per
-- reservation id: a retried settlement records nothing more. Returns 1
-- when recorded, 0 when the id was settled already.
-- Per period (day, week, month): its start, own usage and BYOK usage.
local names = { 'ds', 'd', 'bd', 'ws', 'w', 'bw', 'ms', 'm', 'bm' }
local function settle(k, id, cost, byok)
  if not k.forgotten then
    redis.call('ZREMRANGEBYSCORE', k.settled, '-inf', int(now))
    k.forgotten = true
  end
  if redis.call('ZSCORE', k.settled, id) then return 0 end
  if not k.current then
    local stored = redis.call('HMGET', k.use, 'ds', 'ws', 'ms')
    k.current = { tonumber(stored[1] or ''), tonumber(stored[2] or ''), tonumber(stored[3] or '') }
  end
  redis.call('ZADD', k.settled, int(now + memory), id)
  if not k.remembered then
    redis.call('PEXPIRE', k.settled, math.ceil(memory / 1000))
    k.remembered = true
  end
  release(k, id)
  redis.call('ZREM', k.res, id)
  for p = 1, 3 do
    -- Periods only roll forward: a cost stamped in a period that has already
    -- rolled over (a clock a moment behind) counts in the all-time totals only.
    local start = tonumber(starts[p])
    local current = k.current[p]
    local n = (p - 1) * 3
    if current == nil or start > current then
      redis.call('HSET', k.use, names[n + 1], starts[p], names[n + 2], '0', names[n + 3], '0')
      current = start
      k.current[p] = start
    end
    if start == current then
      redis.call('HINCRBY', k.use, byok and names[n + 3] or names[n + 2], cost)
    end
  end
  redis.call('HINCRBY', k.use, byok and 'bt' or 't', cost)
  -- '-0' is not an integer to Redis, so a zero cost skips the balance.
  if not byok and cost ~= '0' then redis.call('HINCRBY', KEYS[1], 'balance', '-' .. cost) end
  return 1
end

-- Admission: reject on the key limit or a negative balance, else hold the
-- amount. `a` is where the reservation's arguments start in ARGV.
local function reserve(k, a)
  local id, amount = ARGV[a + 1], ARGV[a + 2]
  local reserved, holds = live_reserved(k)
  local usage = usage_fields(k, starts)
  local offset = ({ n = 1, d = 3, w = 5, m = 7 })[ARGV[a + 7]]
  local used = big(usage[offset])
  if ARGV[a + 8] == '1' then used = big_add(used, big(usage[offset + 1])) end
  local committed = big_add(used, reserved)
  -- Refused when this request could take usage past the limit; a free one
  -- (amount 0) when usage has reached it.
  if ARGV[a + 5] == '1' then
    local limit = big(ARGV[a + 6])
    local over
    if amount == '0' then
      over = big_ge(committed, limit)
    else
      over = not big_ge(limit, big_add(committed, big(amount)))
    end
    if over then return { 1, big_str(committed) } end
  end
  if ARGV[a + 9] == '1' then
    local balance = redis.call('HGET', KEYS[1], 'balance') or '0'
    if string.sub(balance, 1, 1) == '-' then return { 2, balance } end
  end
  local previous = redis.call('HGET', k.amt, id)
  -- The same id reserved again replaces its earlier amount.
  if previous then
    local held = big(previous)
    if not big_ge(reserved, held) then
      -- A kept sum that no longer matches its holds: count them again.
      redis.call('HDEL', k.amt, TOTAL, COUNT)
      reserved, holds = live_reserved(k)
    end
    reserved = big_sub(reserved, held)
  else
    holds = holds + 1
  end
  local total = big_add(reserved, big(amount))
  redis.call('HSET', k.amt, id, amount, TOTAL, big_str(total), COUNT, int(holds))
  redis.call('ZADD', k.res, ARGV[a + 3], id)
  -- Only ever extend the keys' lifetime: a shorter TTL must not cut a longer reservation.
  if redis.call('PTTL', k.res) < tonumber(ARGV[a + 4]) then
    redis.call('PEXPIRE', k.res, ARGV[a + 4])
    redis.call('PEXPIRE', k.amt, ARGV[a + 4])
  end
  return { 0, big_str(used), big_str(total) }
end

-- The settlements first, so the reservation sees their costs and not
-- their holds.
local count = tonumber(ARGV[6])
local recorded = 0
for i = 0, count - 1 do
  local a = 7 + i * 4
  recorded = recorded + settle(ledger(ARGV[a]), ARGV[a + 1], ARGV[a + 2], ARGV[a + 3] == '1')
end
local r = 7 + count * 4
if ARGV[r] == nil then return recorded end
return reserve(ledger(ARGV[r]), r)
