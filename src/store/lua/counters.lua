-- Shared by the scripts that check counters (prepended after time.lua).
-- A check is four arguments: kind, capacity, amount, p1:
--   'f' fixed window: p1 = its length (µs); the counter is a hash of
--       counts by window start
--   'c' calendar window: p1 = 'd', 'w' or 'm'; a hash by window start too
--   'r' rolling window: p1 = its length (µs)
--   'g' GCRA: p1 = emission interval (µs); capacity = burst
-- and two keys: the counter's base key and its auxiliary hash (rolling),
-- or, for GCRA, the scope's account hash: a GCRA counter's state (its
-- next arrival, µs) is the field of that hash named by its base key
-- (ledger layout 4), read and written by a ledger call with the rest of
-- the hash. Where the field is absent (the hash does not exist, as for a
-- scope that is no account, or the state is older than the field), the
-- base key holds it, with a TTL.
local function ttl_ms(now, until_us, slack_ms) return int(math.ceil((until_us - now) / 1000) + slack_ms) end
-- The window a fixed ('f', p1 its length in µs) or calendar ('c', p1 'd',
-- 'w' or 'm') counter has at `at`: its start and end (µs).
local function counter_window(kind, p1, at)
  if kind == 'f' then
    local length = num(p1)
    local start = fdiv(at, length) * length
    return start, start + length
  end
  return period_bounds(p1, at)
end
local function amount_of(member) return num(string.match(member, ':(%d+)$')) end

local function rolling_used(now, key, aux, window)
  local used = num(redis.call('HGET', aux, 'used') or '0')
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
      if freed >= needed then return num(page[j + 1]) + window - now end
    end
    start = start + 64
  end
end

-- A GCRA counter's stored next arrival (text, or false): `ledger` (a
-- ledger call's get and put of its account hash's fields) or the hash
-- `aux` first, else the base key; and whether the hash had it.
local function gcra_state(key, aux, ledger)
  local stored
  if ledger then stored = ledger.get(key) else stored = redis.call('HGET', aux, key) end
  if stored then return stored, true end
  return redis.call('GET', key), false
end

-- Reads one check at `now`: a table with fits, used, retry (µs), reset
-- (µs) and what counter_commit needs. Each counter is read once per
-- script: the commit, if any, works from this reading.
local function counter_read(now, key, aux, kind, capacity, amount, p1, ledger)
  -- Every field named at once: a table grown field by field is rehashed
  -- at each power of two.
  local s = { key = key, aux = aux, kind = kind, capacity = capacity, amount = amount, p1 = p1, field = false,
    stop = false, used = 0, fits = false, retry = 0, reset = 0, new_arrival = false, in_hash = false }
  if kind == 'f' or kind == 'c' then
    local start, stop = counter_window(kind, p1, now)
    -- One hash per counter, a field per window start: every key is
    -- declared, and a caller whose clock reads a moment earlier counts in
    -- its own window and never resets a newer one.
    s.field, s.stop = int(start), stop
    s.used = num(redis.call('HGET', key, s.field) or '0')
    s.fits = s.used + amount <= capacity
    local left = stop - now
    s.retry = s.fits and 0 or left
    s.reset = s.used > 0 and left or 0
  elseif kind == 'r' then
    local window = num(p1)
    s.used = rolling_used(now, key, aux, window)
    s.fits = s.used + amount <= capacity
    s.retry = 0
    if not s.fits then s.retry = rolling_retry(now, key, window, s.used, amount, capacity) end
    s.reset = 0
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if #newest > 0 then s.reset = num(newest[2]) + window - now end
  else
    local emission = num(p1)
    local stored, in_hash = gcra_state(key, aux, ledger)
    s.in_hash = in_hash
    local arrival = num(stored or '0')
    if arrival < now then arrival = now end
    s.new_arrival = arrival + emission * amount
    s.fits = s.new_arrival - now <= emission * capacity
    local backlog = arrival - now
    s.used = math.ceil(backlog / emission)
    s.retry = 0
    if not s.fits then s.retry = s.new_arrival - now - emission * capacity end
    s.reset = backlog
  end
  return s
end

-- Adds the amount of a check read (and found to fit) by counter_read at
-- `now`, and brings its used and reset up to date.
local function counter_commit(now, slack_ms, s, ledger)
  if s.amount <= 0 then return end
  local key, kind = s.key, s.kind
  if kind == 'f' or kind == 'c' then
    s.used = redis.call('HINCRBY', key, s.field, int(s.amount))
    local ttl = num(ttl_ms(now, s.stop, slack_ms))
    if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
    -- Windows over (beyond the slack) go as new ones come.
    if redis.call('HLEN', key) > 2 then
      for _, old in ipairs(redis.call('HKEYS', key)) do
        local _, ended = counter_window(kind, s.p1, num(old))
        if ended + slack_ms * 1000 < now then redis.call('HDEL', key, old) end
      end
    end
    s.reset = s.stop - now
  elseif kind == 'r' then
    local window = num(s.p1)
    local seq = redis.call('HINCRBY', s.aux, 'seq', 1)
    redis.call('ZADD', key, int(now), int(seq) .. ':' .. int(s.amount))
    s.used = s.used + s.amount
    redis.call('HSET', s.aux, 'used', int(s.used))
    redis.call('PEXPIRE', key, ttl_ms(now, now + window, slack_ms))
    redis.call('PEXPIRE', s.aux, ttl_ms(now, now + window, slack_ms))
    -- The newest entry is this one, unless a caller whose clock reads
    -- later added one after it.
    if s.reset < window then s.reset = window end
  else
    local emission = num(s.p1)
    if ledger then
      ledger.put(key, int(s.new_arrival))
    elseif s.in_hash or redis.call('EXISTS', s.aux) == 1 then
      redis.call('HSET', s.aux, key, int(s.new_arrival))
    else
      redis.call('SET', key, int(s.new_arrival), 'PX', ttl_ms(now, s.new_arrival, slack_ms))
    end
    local backlog = s.new_arrival - now
    s.used = math.ceil(backlog / emission)
    s.reset = backlog
  end
end

-- Reads `count` counters whose keys start at KEYS[key_base + 1] (two
-- each) and whose arguments start at ARGV[arg_base + 1] (four each),
-- capacities replaced where `capacities` says; a ledger call passes
-- `ledger` (see gcra_state). Returns whether all fit, and the readings,
-- for counters_commit and counters_outcomes.
local function counters_check(now, count, key_base, arg_base, capacities, ledger)
  local all, states = true, {}
  for i = 1, count do
    local a = arg_base + (i - 1) * 4
    local capacity = capacities[i] or num(ARGV[a + 2])
    local s = counter_read(now, KEYS[key_base + 2 * i - 1], KEYS[key_base + 2 * i], ARGV[a + 1],
      capacity, num(ARGV[a + 3]), ARGV[a + 4], ledger)
    all = all and s.fits
    states[i] = s
  end
  return all, states
end

-- Adds to every counter read by counters_check (all of which fit).
local function counters_commit(now, slack_ms, states, ledger)
  for _, s in ipairs(states) do counter_commit(now, slack_ms, s, ledger) end
end

-- Appends to `into`, per check, the first `width` of: fits, used,
-- remaining, retry, reset, capacity.
local function counters_outcomes(states, into, width)
  local n = #into
  for _, s in ipairs(states) do
    local remaining = s.capacity - s.used
    if remaining < 0 then remaining = 0 end
    into[n + 1], into[n + 2], into[n + 3], into[n + 4], into[n + 5] =
      s.fits and 1 or 0, s.used, remaining, s.retry, s.reset
    if width == 6 then into[n + 6] = s.capacity end
    n = n + width
  end
end
