-- Shared by the ledger scripts (prepended to each).
-- A key's ledger is four Redis keys, passed to the helpers as a table `k`:
-- k.use usage hash; k.res reservations zset (id -> expiry µs); k.amt
-- reservation amounts hash; k.settled settled ids zset (id -> forget at µs).
-- The account hash {purchased, balance} is KEYS[1] in every ledger script.
local function int(x) return string.format('%.0f', x) end

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
  return int(a[1]) .. string.format('%09.0f', a[2])
end

-- Drops reservations expired by `now` (every ledger script does, as the
-- in-process store does on every access, so both agree on what is live).
local function drop_expired(k, now)
  local expired = redis.call('ZRANGEBYSCORE', k.res, '-inf', int(now))
  -- In slices: unpack() fails past a few thousand values.
  for i = 1, #expired, 1000 do
    redis.call('HDEL', k.amt, unpack(expired, i, math.min(i + 999, #expired)))
  end
  if #expired > 0 then redis.call('ZREMRANGEBYSCORE', k.res, '-inf', int(now)) end
end

-- The sum of the live reservations (big); expired ones must be dropped first.
local function live_reserved(k)
  local reserved = big('0')
  for _, amount in ipairs(redis.call('HVALS', k.amt)) do reserved = big_add(reserved, big(amount)) end
  return reserved
end

-- The stored usage fields, as strings; a period's totals count only while
-- its stored start is the current one.
-- Order: total, byok_total, day, byok_day, week, byok_week, month, byok_month.
local function usage_fields(k, starts)
  local f = redis.call('HMGET', k.use, 't', 'bt', 'ds', 'd', 'bd', 'ws', 'w', 'bw', 'ms', 'm', 'bm')
  local out = { f[1] or '0', f[2] or '0' }
  for p = 0, 2 do
    local start, own, byok = f[3 + p * 3], f[4 + p * 3], f[5 + p * 3]
    if start == starts[p + 1] then
      table.insert(out, own or '0')
      table.insert(out, byok or '0')
    else
      table.insert(out, '0')
      table.insert(out, '0')
    end
  end
  return out
end
