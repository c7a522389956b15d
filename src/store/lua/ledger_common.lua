-- Shared by the ledger scripts (prepended to each).
-- KEYS[1] account hash {purchased, balance}; KEYS[2] key usage hash;
-- KEYS[3] reservations zset (id -> expiry µs); KEYS[4] reservation amounts hash.
local function int(x) return string.format('%.0f', x) end

-- Drops expired reservations and returns the sum of the live ones.
local function live_reserved(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', int(now))
  if #expired > 0 then
    redis.call('HDEL', KEYS[4], unpack(expired))
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', int(now))
  end
  local reserved = 0
  for _, amount in ipairs(redis.call('HVALS', KEYS[4])) do reserved = reserved + tonumber(amount) end
  return reserved
end

-- The stored usage fields, as strings, with period totals zeroed when their
-- stored period start is not the current one.
-- Order: total, byok_total, day, byok_day, week, byok_week, month, byok_month.
local function usage_fields(starts)
  local f = redis.call('HMGET', KEYS[2], 't', 'bt', 'ds', 'd', 'bd', 'ws', 'w', 'bw', 'ms', 'm', 'bm')
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
