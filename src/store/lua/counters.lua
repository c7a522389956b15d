-- Shared by the scripts that check counters (prepended after time.lua).
-- A check is four arguments: kind, capacity, amount, p1:
--   'f' fixed window: p1 = its length (µs); the counter is a hash of
--       counts by window start
--   'c' calendar window: p1 = 'd', 'w' or 'm'; a hash by window start too
--   'r' rolling window: p1 = its length (µs)
--   'g' GCRA: p1 = emission interval (µs); capacity = burst
-- and two keys: the counter's base key and its auxiliary hash (rolling).
local function cint(x) return string.format('%.0f', x) end
local function ttl_ms(now, until_us, slack_ms) return cint(math.ceil((until_us - now) / 1000) + slack_ms) end
local function amount_of(member) return tonumber(string.match(member, ':(%d+)$')) end

local function rolling_used(now, key, aux, window)
  local used = tonumber(redis.call('HGET', aux, 'used') or '0')
  local cutoff = cint(now - window)
  local expired = redis.call('ZRANGEBYSCORE', key, '-inf', cutoff)
  if #expired > 0 then
    for _, member in ipairs(expired) do used = used - amount_of(member) end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    redis.call('HSET', aux, 'used', cint(used))
  end
  if used ~= 0 and redis.call('ZCARD', key) == 0 then used = 0 end
  return used
end

local function rolling_retry(now, key, window, used, amount, capacity)
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

-- One check at `now`; when `commit`, adds its amount. Returns fits, used,
-- retry after (µs), reset after (µs).
local function counter_evaluate(now, slack_ms, key, aux, kind, capacity, amount, p1, commit)
  if kind == 'f' or kind == 'c' then
    local function bounds(at)
      if kind == 'f' then
        local length = tonumber(p1)
        local start = fdiv(at, length) * length
        return start, start + length
      end
      return period_bounds(p1, at)
    end
    local start, stop = bounds(now)
    -- One hash per counter, a field per window start: every key is
    -- declared, and a caller whose clock reads a moment earlier counts in
    -- its own window and never resets a newer one.
    local field = cint(start)
    local used = tonumber(redis.call('HGET', key, field) or '0')
    local fits = used + amount <= capacity
    if fits and commit and amount > 0 then
      used = redis.call('HINCRBY', key, field, cint(amount))
      local ttl = tonumber(ttl_ms(now, stop, slack_ms))
      if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
      -- Windows over (beyond the slack) go as new ones come.
      if redis.call('HLEN', key) > 2 then
        for _, old in ipairs(redis.call('HKEYS', key)) do
          local _, ended = bounds(tonumber(old))
          if ended + slack_ms * 1000 < now then redis.call('HDEL', key, old) end
        end
      end
    end
    local left = stop - now
    local retry = 0
    if not fits then retry = left end
    local reset = 0
    if used > 0 then reset = left end
    return fits, used, retry, reset
  elseif kind == 'r' then
    local window = tonumber(p1)
    local used = rolling_used(now, key, aux, window)
    local fits = used + amount <= capacity
    if fits and commit and amount > 0 then
      local seq = redis.call('HINCRBY', aux, 'seq', 1)
      redis.call('ZADD', key, cint(now), cint(seq) .. ':' .. cint(amount))
      used = used + amount
      redis.call('HSET', aux, 'used', cint(used))
      redis.call('PEXPIRE', key, ttl_ms(now, now + window, slack_ms))
      redis.call('PEXPIRE', aux, ttl_ms(now, now + window, slack_ms))
    end
    local retry = 0
    if not fits then retry = rolling_retry(now, key, window, used, amount, capacity) end
    local reset = 0
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if #newest > 0 then reset = tonumber(newest[2]) + window - now end
    return fits, used, retry, reset
  else
    local emission = tonumber(p1)
    local tolerance = emission * capacity
    local arrival = tonumber(redis.call('GET', key) or '0')
    if arrival < now then arrival = now end
    local new_arrival = arrival + emission * amount
    local fits = new_arrival - now <= tolerance
    if fits and commit and amount > 0 then
      redis.call('SET', key, cint(new_arrival), 'PX', ttl_ms(now, new_arrival, slack_ms))
      arrival = new_arrival
    end
    local backlog = arrival - now
    local used = math.ceil(backlog / emission)
    local retry = 0
    if not fits then retry = new_arrival - now - tolerance end
    return fits, used, retry, backlog
  end
end

-- Checks `count` counters whose keys start at KEYS[key_base + 1] (two
-- each) and whose arguments start at ARGV[arg_base + 1] (four each),
-- capacities replaced where `capacities` says. When all fit and `commit`
-- is true, adds to all; else to none. Returns whether all fit and, per
-- check, {fits, used, remaining, retry, reset, capacity}.
local function counters_check(now, slack_ms, count, key_base, arg_base, capacities, commit)
  local function args(i)
    local a = arg_base + (i - 1) * 4
    local capacity = capacities[i] or tonumber(ARGV[a + 2])
    return KEYS[key_base + 2 * i - 1], KEYS[key_base + 2 * i], ARGV[a + 1], capacity, tonumber(ARGV[a + 3]), ARGV[a + 4]
  end
  local all = true
  for i = 1, count do
    local key, aux, kind, capacity, amount, p1 = args(i)
    if not counter_evaluate(now, slack_ms, key, aux, kind, capacity, amount, p1, false) then
      all = false
      break
    end
  end
  local outcomes = {}
  for i = 1, count do
    local key, aux, kind, capacity, amount, p1 = args(i)
    local fits, used, retry, reset = counter_evaluate(now, slack_ms, key, aux, kind, capacity, amount, p1, all and commit)
    local remaining = capacity - used
    if remaining < 0 then remaining = 0 end
    outcomes[i] = { fits and 1 or 0, used, remaining, retry, reset, capacity }
  end
  return all, outcomes
end
