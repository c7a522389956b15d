-- Shared by the ledger scripts (prepended to each).
-- A key's ledger is five Redis keys, passed to the helpers as a table `k`:
-- k.use usage hash; k.res reservations zset (id -> expiry µs); k.amt
-- reservation amounts hash (id -> 'amount:c' when the balance holds it
-- too, 'amount:b' when not (BYOK or free), then ':retention µs:most
-- records' when its lapse leaves a generation record; and their sum and
-- count under TOTAL and COUNT);
-- k.settled zset of ids known without a live hold: a settlement's marker
-- (id -> forget at µs, positive), and a hold that lapsed (id -> minus the
-- µs it is forgotten at); k.lapsed hash of what each lapse charged (id ->
-- 'amount:byok 0/1:day start:week start:month start'), which its
-- settlement gives back; k.lapse how long (µs) lapses are kept.
-- The account's side is the table ACCT: acct (hash {purchased, balance}),
-- res and amt (its holds on the balance, id -> amount), gen and genexp
-- (generation records, see keep_generation); `now` and `lapse` are set by
-- the script.

-- Exact non-negative integers as {high, low} in base 10^9: a Lua number is
-- a double, exact only up to 2^53 nano-credits (9 million credits), and a
-- key's all-time usage may grow beyond that.
-- Set by each script before it calls anything here (see the top).
local now, lapse, ACCT

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

-- How long hold keys outlive their last hold: an orphan hold (its
-- instance died) is still there, to lapse and be charged, at the
-- account's next call within this time (30 days).
local ORPHAN_HOLD_MS = 30 * 86400000

-- The amount of a hold's stored value (see the top).
local function amount_of(value)
  local colon = string.find(value, ':', 1, true)
  if colon then return string.sub(value, 1, colon - 1) end
  return value
end

-- The kept sum and count (strings, or false when none are kept) less the
-- holds `amounts` (strings, or false for holds already gone), stored
-- back; when they would go negative (they no longer match) they are
-- dropped instead, and live_reserved counts the holds afresh.
local function take_held(k, total, count, amounts)
  if not (total and count) then return end
  local sum, holds = big(total), tonumber(count)
  for _, amount in ipairs(amounts) do
    if amount then
      local held = big(amount_of(amount))
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
    -- An eighth more than asked (at most an hour), as keep_alive gives: a
    -- steady flow of settlements extends it once in that margin.
    if redis.call('PTTL', k.settled) < ttl_ms then
      redis.call('PEXPIRE', k.settled, ttl_ms + math.min(math.ceil(ttl_ms / 8), 3600000))
    end
    k.settled_ms = ttl_ms
  end
end

-- Forgets, once per call, the ids of `k.settled` whose time is up, and
-- the charges of the lapses among them.
local function forget_settled(k, now)
  if k.forgotten then return end
  redis.call('ZREMRANGEBYSCORE', k.settled, 0, int(now))
  -- In slices: unpack() fails past a few thousand values.
  repeat
    local lapsed = redis.call('ZRANGEBYSCORE', k.settled, int(-now), '(0', 'LIMIT', 0, 1000)
    if #lapsed > 0 then
      redis.call('HDEL', k.lapsed, unpack(lapsed))
      redis.call('ZREM', k.settled, unpack(lapsed))
    end
  until #lapsed < 1000
  k.forgotten = true
end

-- Per period (day, week, month): the usage hash's fields for its start,
-- own usage and BYOK usage.
local PERIOD_FIELDS = { 'ds', 'd', 'bd', 'ws', 'w', 'bw', 'ms', 'm', 'bm' }

-- Adds `cost` (decimal text) to the key's usage in the periods containing
-- `now`, own or BYOK. Periods only roll forward: a cost stamped in a
-- period that has already rolled over (a clock a moment behind) counts in
-- the all-time totals only.
local function add_usage(k, cost, byok)
  if not k.current then
    local stored = redis.call('HMGET', k.use, 'ds', 'ws', 'ms')
    k.current = { tonumber(stored[1] or ''), tonumber(stored[2] or ''), tonumber(stored[3] or '') }
  end
  local period_start = period_starts(now)
  for p = 1, 3 do
    local start = tonumber(period_start[p])
    local current = k.current[p]
    local n = (p - 1) * 3
    if current == nil or start > current then
      redis.call('HSET', k.use, PERIOD_FIELDS[n + 1], period_start[p], PERIOD_FIELDS[n + 2], '0', PERIOD_FIELDS[n + 3], '0')
      current = start
      k.current[p] = start
    end
    if start == current then
      redis.call('HINCRBY', k.use, byok and PERIOD_FIELDS[n + 3] or PERIOD_FIELDS[n + 2], cost)
    end
  end
  redis.call('HINCRBY', k.use, byok and 'bt' or 't', cost)
end

-- Nano-credits (decimal text) as decimal credits: '0.4', '12'.
local function credits_text(nanos)
  local n = #nanos
  if n <= 9 then nanos = string.rep('0', 10 - n) .. nanos; n = 10 end
  local whole, fraction = string.sub(nanos, 1, n - 9), string.gsub(string.sub(nanos, n - 8), '0+$', '')
  if fraction == '' then return whole end
  return whole .. '.' .. fraction
end

-- RFC 3339 (to the second) of `micros`.
local function rfc3339(micros)
  local seconds = fdiv(micros, 1000000)
  local day = fdiv(seconds, 86400)
  local y, m = civil_from_days(day)
  local d = day - days_from_civil(y, m) + 1
  local s = seconds - day * 86400
  return string.format('%04d-%02d-%02dT%02d:%02d:%02dZ', y, m, d, fdiv(s, 3600), fdiv(s % 3600, 60), s % 60)
end

-- Keeps generation record `record` of `id` (kept `retention` µs) in the
-- account's records, removing the expired ones and the oldest past `most`.
local function keep_generation(id, record, retention, most)
  if not ACCT.swept then
    local expired = redis.call('ZRANGEBYSCORE', ACCT.genexp, '-inf', int(now), 'LIMIT', 0, 256)
    if #expired > 0 then
      redis.call('HDEL', ACCT.gen, unpack(expired))
      redis.call('ZREM', ACCT.genexp, unpack(expired))
    end
    ACCT.swept = true
  end
  redis.call('HSET', ACCT.gen, id, record)
  redis.call('ZADD', ACCT.genexp, int(now + retention), id)
  -- Past the cap the earliest-expiring go, in slices (unpack() fails past
  -- a few thousand values).
  local over = redis.call('ZCARD', ACCT.genexp) - most
  while over > 0 do
    local popped = redis.call('ZPOPMIN', ACCT.genexp, math.min(over, 1000))
    local ids = {}
    for j = 1, #popped, 2 do ids[#ids + 1] = popped[j] end
    redis.call('HDEL', ACCT.gen, unpack(ids))
    over = over - #ids
  end
  -- The keys live as long as their longest-kept record.
  keep_alive(math.ceil(retention / 1000) + ACCT.slack_ms, ACCT.genexp, ACCT.gen)
end

-- The generation record a lapse leaves (as `lapse_record` in ledger.rs).
local function lapse_record(k, id, amount, byok)
  local cost = credits_text(amount)
  return '{"id":' .. cjson.encode('gen-' .. id) .. ',"total_cost":' .. cost .. ',"usage":' .. cost
    .. ',"cost_basis":"lapsed","is_byok":' .. (byok and 'true' or 'false') .. ',"lapsed":true,"created_at":"'
    .. rfc3339(now) .. '","user_id":' .. cjson.encode(ACCT.name) .. ',"key_hash":' .. cjson.encode(k.name) .. '}'
end

-- Lapses the holds expired by `now` (every ledger script does, as the
-- in-process store does on every access, so both agree on what is live):
-- each is charged its held amount, kept in `k.lapsed` with their ids in
-- `k.settled` until `k.lapse` past now. The account's side (`k` is ACCT)
-- charges the balance; a key's the key's usage: own when its value says
-- the balance held it too, else BYOK; and writes the lapse's generation
-- record when the hold asked for one.
local function drop_expired(k, now)
  local expired = redis.call('ZRANGEBYSCORE', k.res, '-inf', int(now), 'WITHSCORES')
  if #expired == 0 then return end
  local forget_at = now + k.lapse
  local starts = nil
  -- In slices: unpack() fails past a few thousand values.
  for i = 1, #expired, 2000 do
    local slice, lapsed, charges = {}, {}, {}
    for j = i, math.min(i + 1998, #expired - 1), 2 do
      table.insert(slice, expired[j])
      table.insert(lapsed, int(-forget_at))
      table.insert(lapsed, expired[j])
    end
    local kept = redis.call('HMGET', k.amt, TOTAL, COUNT)
    local values = redis.call('HMGET', k.amt, unpack(slice))
    take_held(k, kept[1], kept[2], values)
    redis.call('HDEL', k.amt, unpack(slice))
    for j, id in ipairs(slice) do
      local value = values[j]
      if value then
        local amount = amount_of(value)
        if k == ACCT then
          if amount ~= '0' then redis.call('HINCRBY', ACCT.acct, 'balance', '-' .. amount) end
        else
          -- Held on the balance too ('c'; a hold an older version wrote
          -- says nothing, and was): its account's lapse charged it there.
          local byok = string.sub(value, #amount + 1, #amount + 2) == ':b'
          if amount ~= '0' then add_usage(k, amount, byok) end
          starts = starts or period_starts(now)
          table.insert(charges, id)
          table.insert(charges, amount .. ':' .. (byok and '1' or '0') .. ':' .. starts[1] .. ':' .. starts[2] .. ':' .. starts[3])
          local _, _, retention, most = string.find(value, '^%d+:[cb]:(%d+):(%d+)$')
          if retention then
            keep_generation(id, lapse_record(k, id, amount, byok), tonumber(retention), tonumber(most))
          end
        end
      end
    end
    if #charges > 0 then redis.call('HSET', k.lapsed, unpack(charges)) end
    if k ~= ACCT then redis.call('ZADD', k.settled, unpack(lapsed)) end
  end
  redis.call('ZREMRANGEBYSCORE', k.res, '-inf', int(now))
  local lapse_ms = math.ceil(k.lapse / 1000)
  if k ~= ACCT then
    forget_settled(k, now)
    keep_settled_for(k, lapse_ms)
    if redis.call('PTTL', k.lapsed) < lapse_ms then redis.call('PEXPIRE', k.lapsed, lapse_ms) end
  end
end

-- Gives back what the lapse of `id` charged, if it did and is still
-- known, to the key's usage (the all-time total, and each period still
-- the one it was charged in) and, unless BYOK, to the balance; whether it
-- did.
local function undo_lapse(k, id)
  local charge = redis.call('HGET', k.lapsed, id)
  if charge then
    redis.call('HDEL', k.lapsed, id)
    local _, _, amount, byok, ds, ws, ms = string.find(charge, '^(%d+):(%d):(%d+):(%d+):(%d+)$')
    if amount and amount ~= '0' then
      local stored = redis.call('HMGET', k.use, 'ds', 'ws', 'ms')
      local charged_in = { ds, ws, ms }
      for p = 1, 3 do
        if stored[p] == charged_in[p] then
          redis.call('HINCRBY', k.use, PERIOD_FIELDS[(p - 1) * 3 + (byok == '1' and 3 or 2)], '-' .. amount)
        end
      end
      redis.call('HINCRBY', k.use, byok == '1' and 'bt' or 't', '-' .. amount)
      if byok == '0' then redis.call('HINCRBY', ACCT.acct, 'balance', amount) end
    end
  end
  return charge ~= nil and charge ~= false
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
      reserved, holds = big_add(reserved, big(amount_of(fields[i + 1]))), holds + 1
    end
  end
  return reserved, holds, kept[3]
end

-- A usage hash's fields, as one HMGET reads them: all-time own and BYOK
-- usage, then per period (day, week, month) its start, own and BYOK usage.
local USAGE_FIELDS = { 't', 'bt', 'ds', 'd', 'bd', 'ws', 'w', 'bw', 'ms', 'm', 'bm' }
-- What an admission reads of the key before its usage: `rv` (revoked at),
-- then its terms (set_key_terms): `tl` limit ('-' none), `tr` reset
-- (n/d/w/m), `tb` BYOK counted (0/1), `tx` expiry (µs, '' never).
local KEY_FIELDS = { 'rv', 'tl', 'tr', 'tb', 'tx' }
local KEY_FIELDS_AND_USAGE = { 'rv', 'tl', 'tr', 'tb', 'tx', 't', 'bt', 'ds', 'd', 'bd', 'ws', 'w', 'bw', 'ms', 'm', 'bm' }

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
