-- Shared by the record scripts (prepended to each, after time.lua). A
-- collection is five keys under one hash tag: KEYS[1] values hash
-- (id -> value), KEYS[2] revisions hash (id -> revision), KEYS[3]
-- creation-order zset (id by sequence number), KEYS[4] the sequence
-- counter, KEYS[5] expiries zset (id -> when the record expires, µs; only
-- records written with a lifetime). A record that expires at `t` is live
-- while `now < t`.
-- Expiries stay below 2^53 µs (a lifetime is at most 100 years), so
-- scores are exact.

-- Removes every record expired at `now`, so nothing below sees one: not a
-- read, not a count, not a listing's ranks.
local function purge_expired(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', int(now))
  if #expired == 0 then return end
  for _, id in ipairs(expired) do
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', int(now))
end

-- When every record of the collection has a lifetime, its keys live as
-- long as the longest-lived record plus `slack_ms`, so a collection nobody
-- calls again leaves Redis by itself; once a record without one is
-- written, they are kept. Expiry of the keys only reclaims memory: the
-- expiries zset decides what is live.
local function set_lifetime(now, slack_ms)
  local count = redis.call('HLEN', KEYS[2])
  if count == 0 then return end
  if redis.call('ZCARD', KEYS[5]) == count then
    local latest = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
    local ms = int(math.ceil((tonumber(latest[2]) - now) / 1000) + slack_ms)
    for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ms) end
  -- The sequence counter outlives an emptied collection: its expiry says
  -- whether the keys were set to expire.
  elseif redis.call('PTTL', KEYS[4]) >= 0 then
    for i = 1, 5 do redis.call('PERSIST', KEYS[i]) end
  end
end
