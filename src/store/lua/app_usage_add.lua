-- Adds app usage to one scope's current day, week and month. KEYS[1..3]:
-- the scope's day, week and month hashes: field 's' the period's start
-- (µs); 'r' .. SEP .. app .. SEP .. model requests; 't' .. SEP .. app ..
-- SEP .. model tokens; 'a' .. SEP .. app the app's details; 'n' the
-- number of rows.
-- ARGV: now (µs, or '' for Redis's clock), the most rows per period, key
-- TTL slack (ms), row count N, then N times: app, details, model,
-- requests, tokens.
local SEP = '\31'
local now = clock_now(ARGV[1])
local most = tonumber(ARGV[2])
local slack_ms = tonumber(ARGV[3])
local count = tonumber(ARGV[4])
for p, name in ipairs({ 'd', 'w', 'm' }) do
  local key = KEYS[p]
  local start, finish = period_bounds(name, now)
  local stored = tonumber(redis.call('HGET', key, 's') or '')
  -- Periods only roll forward: a write stamped in one that has already
  -- rolled over (a caller's clock a moment behind) counts nowhere.
  if stored == nil or start > stored then
    redis.call('DEL', key)
    redis.call('HSET', key, 's', int(start))
    stored = start
  end
  if start == stored then
    local rows = tonumber(redis.call('HGET', key, 'n') or '0')
    for i = 0, count - 1 do
      local a = 5 + i * 5
      local row = ARGV[a] .. SEP .. ARGV[a + 2]
      local known = redis.call('HEXISTS', key, 'r' .. SEP .. row) == 1
      if known or rows < most then
        if not known then
          rows = rows + 1
          redis.call('HSET', key, 'n', rows)
        end
        redis.call('HINCRBY', key, 'r' .. SEP .. row, ARGV[a + 3])
        redis.call('HINCRBY', key, 't' .. SEP .. row, ARGV[a + 4])
        redis.call('HSET', key, 'a' .. SEP .. ARGV[a], ARGV[a + 1])
      end
    end
    redis.call('PEXPIRE', key, math.ceil((finish - now) / 1000) + slack_ms)
  end
end
return 1
