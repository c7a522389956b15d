-- Checks every counter, then adds to all of them or to none.
-- KEYS: two per check: the counter, and its auxiliary hash (rolling windows).
-- ARGV[1]: now (µs); ARGV[2]: TTL slack (ms); then four per check:
--   kind, capacity, amount, p1
--   'w' fixed or calendar window (the key names the window): p1 = its end (µs)
--   'r' rolling window: p1 = its length (µs)
--   'g' GCRA: p1 = emission interval (µs); capacity = burst
-- Returns {admitted, then per check: fits, used, remaining, retry_after µs, reset_after µs}.
-- Integers are written with %.0f: Lua's own number formatting would turn
-- large ones into exponent notation.
local now = tonumber(ARGV[1])
local slack_ms = tonumber(ARGV[2])
local count = #KEYS / 2

local function int(x) return string.format('%.0f', x) end
local function ttl_ms(until_us) return int(math.ceil((until_us - now) / 1000) + slack_ms) end
local function amount_of(member) return tonumber(string.match(member, ':(%d+)$')) end

local function rolling_used(key, aux, window)
  local used = tonumber(redis.call('HGET', aux, 'used') or '0')
  local cutoff = int(now - window)
  local expired = redis.call('ZRANGEBYSCORE', key, '-inf', cutoff)
  if #expired > 0 then
    for _, member in ipairs(expired) do used = used - amount_of(member) end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    redis.call('HSET', aux, 'used', int(used))
  end
  if used ~= 0 and redis.call('ZCARD', key) == 0 then used = 0 end
  return used
end

local function rolling_retry(key, window, used, amount, capacity)
  if amount > capacity then return window end
  local needed = used + amount - capacity
  local freed = 0
  local start = 0
  while true do
    local page = redis.call('ZRANGE', key, start, start + 63, 'WITHSCORES')
    if #page == 0 then return window end
    for j = 1, #page, 2 do
      freed = freed + amount_of(page[j])
      if freed >= needed then return tonumber(page[j + 1]) + window - now end
    end
    start = start + 64
  end
end

local function evaluate(i, commit)
  local key, aux = KEYS[2 * i - 1], KEYS[2 * i]
  local base = 2 + (i - 1) * 4
  local kind = ARGV[base + 1]
  local capacity = tonumber(ARGV[base + 2])
  local amount = tonumber(ARGV[base + 3])
  local p1 = tonumber(ARGV[base + 4])
  if kind == 'w' then
    local used = tonumber(redis.call('GET', key) or '0')
    local fits = used + amount <= capacity
    if fits and commit and amount > 0 then
      used = redis.call('INCRBY', key, int(amount))
      redis.call('PEXPIRE', key, ttl_ms(p1))
    end
    local left = p1 - now
    local retry = 0
    if not fits then retry = left end
    local reset = 0
    if used > 0 then reset = left end
    return fits, used, retry, reset
  elseif kind == 'r' then
    local used = rolling_used(key, aux, p1)
    local fits = used + amount <= capacity
    if fits and commit and amount > 0 then
      local seq = redis.call('HINCRBY', aux, 'seq', 1)
      redis.call('ZADD', key, int(now), int(seq) .. ':' .. int(amount))
      used = used + amount
      redis.call('HSET', aux, 'used', int(used))
      redis.call('PEXPIRE', key, ttl_ms(now + p1))
      redis.call('PEXPIRE', aux, ttl_ms(now + p1))
    end
    local retry = 0
    if not fits then retry = rolling_retry(key, p1, used, amount, capacity) end
    local reset = 0
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if #newest > 0 then reset = tonumber(newest[2]) + p1 - now end
    return fits, used, retry, reset
  else
    local tolerance = p1 * capacity
    local arrival = tonumber(redis.call('GET', key) or '0')
    if arrival < now then arrival = now end
    local new_arrival = arrival + p1 * amount
    local fits = new_arrival - now <= tolerance
    if fits and commit and amount > 0 then
      redis.call('SET', key, int(new_arrival), 'PX', ttl_ms(new_arrival))
      arrival = new_arrival
    end
    local backlog = arrival - now
    local used = math.ceil(backlog / p1)
    local retry = 0
    if not fits then retry = new_arrival - now - tolerance end
    return fits, used, retry, backlog
  end
end

local admitted = true
for i = 1, count do
  local fits = evaluate(i, false)
  if not fits then admitted = false break end
end
local result = { admitted and 1 or 0 }
for i = 1, count do
  local fits, used, retry, reset = evaluate(i, admitted)
  local capacity = tonumber(ARGV[2 + (i - 1) * 4 + 2])
  local remaining = capacity - used
  if remaining < 0 then remaining = 0 end
  table.insert(result, fits and 1 or 0)
  table.insert(result, used)
  table.insert(result, remaining)
  table.insert(result, retry)
  table.insert(result, reset)
end
return result
