-- Shared by the ledger scripts (prepended to each).
-- A key's ledger is four Redis keys, passed to the helpers as a table `k`:
-- k.use usage hash; k.res reservations zset (id -> expiry µs); k.amt
-- reservation amounts hash (id -> amount, and their sum and count under
-- TOTAL and COUNT);
-- k.settled zset of ids known without a live hold: a settlement made
-- without a granted hold (id -> forget at µs, positive), and a hold that
-- expired unsettled (id -> minus the µs it is forgotten at), which its
-- first settlement still takes; k.lapse how long (µs) the latter are kept.
-- The account hash {purchased, balance} is KEYS[1] in every ledger script.

-- Exact non-negative integers as {high, low} in base 10^9: a Lua number is
-- a double, exact only up to 2^53 nano-credits (9 million credits), and a
-- key's all-time usage may grow beyond that.
local BASE = 1000000000
local function big(s)
  s = s or '0'
  local n = #s
  if n <= 9 then return { 0, tonumber(s) } end
  return { tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8)) }
end
local function big_add(a, b)
  local high, low = a[1] + b[1], a[2] + b[2]
  if low >= BASE then high, low = high + 1, low - BASE end
  return { high, low }
end
local function big_sub(a, b) -- a >= b
  local high, low = a[1] - b[1], a[2] - b[2]
  if low < 0 then high, low = high - 1, low + BASE end
  return { high, low }
end
local function big_ge(a, b) return a[1] > b[1] or (a[1] == b[1] and a[2] >= b[2]) end
local function big_str(a)
  if a[1] == 0 then return int(a[2]) end
  return int(a[1]) .. string.format('%09d', a[2])
end

-- The amounts hash also keeps the sum of its holds and how many there
-- are, so a reservation need not add up every hold in flight. No
-- reservation id can be one of these fields: ids are UTF-8 text, and a
-- lone 0xFF byte never is. The count is checked against the hash's
-- length on every read, so holds written by something that did not keep
-- the sum (an earlier version during a rolling upgrade) are noticed and
-- counted afresh.
local TOTAL, COUNT = '\255total', '\255count'

-- The kept sum and count (strings, or false when none are kept) less the
-- holds `amounts` (strings, or false for holds already gone), stored
-- back; when they would go negative (they no longer match) they are
-- dropped instead, and live_reserved counts the holds afresh.
local function take_held(k, total, count, amounts)
  if not (total and count) then return end
  local sum, holds = big(total), tonumber(count)
  for _, amount in ipairs(amounts) do
    if amount then
      local held = big(amount)
      if holds < 1 or not big_ge(sum, held) then
        redis.call('HDEL', k.amt, TOTAL, COUNT)
        return
      end
      sum, holds = big_sub(sum, held), holds - 1
    end
  end
  redis.call('HSET', k.amt, TOTAL, big_str(sum), COUNT, int(holds))
end

-- Keeps `first` and `second` for at least `ttl_ms` more, never shortening
-- them: the first's TTL stands for both, unless `check_second` says the
-- second may be new. When they have less left they get an eighth more
-- than asked (at most an hour), so the write that extends them comes once
-- in that margin, not with every call.
local function keep_alive(ttl_ms, first, second, check_second)
  local extended = ttl_ms + math.min(math.ceil(ttl_ms / 8), 3600000)
  if redis.call('PTTL', first) < ttl_ms then
    redis.call('PEXPIRE', first, extended)
    redis.call('PEXPIRE', second, extended)
  elseif check_second and redis.call('PTTL', second) < ttl_ms then
    redis.call('PEXPIRE', second, extended)
  end
end

-- Keeps `k.settled` for at least `ttl_ms` more.
local function keep_settled_for(k, ttl_ms)
  if (k.settled_ms or 0) < ttl_ms then
    if redis.call('PTTL', k.settled) < ttl_ms then redis.call('PEXPIRE', k.settled, ttl_ms) end
    k.settled_ms = ttl_ms
  end
end

-- Forgets, once per call, the ids of `k.settled` whose time is up.
local function forget_settled(k, now)
  if k.forgotten then return end
  redis.call('ZREMRANGEBYSCORE', k.settled, 0, int(now))
  redis.call('ZREMRANGEBYSCORE', k.settled, int(-now), '(0')
  k.forgotten = true
end

-- Drops reservations expired by `now` (every ledger script does, as the
-- in-process store does on every access, so both agree on what is live).
-- A key's expired holds lapse: their ids stay in `k.settled` until
-- `k.lapse` past their expiry.
local function drop_expired(k, now)
  local expired = redis.call('ZRANGEBYSCORE', k.res, '-inf', int(now), 'WITHSCORES')
  local any_lapsed = false
  -- In slices: unpack() fails past a few thousand values.
  for i = 1, #expired, 2000 do
    local slice, lapsed = {}, {}
    for j = i, math.min(i + 1998, #expired - 1), 2 do
      local id, forget_at = expired[j], tonumber(expired[j + 1]) + (k.lapse or 0)
      table.insert(slice, id)
      if k.settled and forget_at > now then
        table.insert(lapsed, int(-forget_at))
        table.insert(lapsed, id)
      end
    end
    local kept = redis.call('HMGET', k.amt, TOTAL, COUNT)
    take_held(k, kept[1], kept[2], redis.call('HMGET', k.amt, unpack(slice)))
    redis.call('HDEL', k.amt, unpack(slice))
    if #lapsed > 0 then
      redis.call('ZADD', k.settled, unpack(lapsed))
      any_lapsed = true
    end
  end
  if #expired > 0 then redis.call('ZREMRANGEBYSCORE', k.res, '-inf', int(now)) end
  if any_lapsed then
    forget_settled(k, now)
    keep_settled_for(k, math.ceil(k.lapse / 1000))
  end
end

-- Releases the hold of reservation `id`, if it still has one.
local function release(k, id)
  local held = redis.call('HMGET', k.amt, id, TOTAL, COUNT)
  if not held[1] then return end
  redis.call('HDEL', k.amt, id)
  take_held(k, held[2], held[3], { held[1] })
end

-- The sum (big) and number of the live reservations, and (read in the
-- same call) the amount held by reservation `id` when one is given and
-- holds; expired ones must be dropped first. The kept sum and count while
-- the count matches the hash's length, else the holds counted.
local function live_reserved(k, id)
  local kept
  if id then kept = redis.call('HMGET', k.amt, TOTAL, COUNT, id) else kept = redis.call('HMGET', k.amt, TOTAL, COUNT) end
  if kept[1] and kept[2] and tonumber(kept[2]) == redis.call('HLEN', k.amt) - 2 then
    return big(kept[1]), tonumber(kept[2]), kept[3]
  end
  local reserved, holds = big('0'), 0
  local fields = redis.call('HGETALL', k.amt)
  for i = 1, #fields, 2 do
    if fields[i] ~= TOTAL and fields[i] ~= COUNT then
      reserved, holds = big_add(reserved, big(fields[i + 1])), holds + 1
    end
  end
  return reserved, holds, kept[3]
end

-- A usage hash's fields, as one HMGET reads them: all-time own and BYOK
-- usage, then per period (day, week, month) its start, own and BYOK usage.
local USAGE_FIELDS = { 't', 'bt', 'ds', 'd', 'bd', 'ws', 'w', 'bw', 'ms', 'm', 'bm' }

-- Own and BYOK usage (strings) in period `p` (0 all time, 1 day, 2 week,
-- 3 month) from `f`, the values of USAGE_FIELDS from `f[at + 1]` on; a
-- period's totals count only while its stored start is `starts[p]`, the
-- current one (see period_starts; not needed for all time).
local function usage_in(f, at, p, starts)
  if p == 0 then return f[at + 1] or '0', f[at + 2] or '0' end
  local i = at + 3 * p
  if f[i] ~= starts[p] then return '0', '0' end
  return f[i + 1] or '0', f[i + 2] or '0'
end
