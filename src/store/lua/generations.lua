-- Reads an account's generation records. KEYS[1]: records hash (id ->
-- record), KEYS[2]: their expiries zset (id -> µs), KEYS[3]: the account's
-- ledger hash (the cap in its state `s`: records past the newest that many are removed
-- at the account's next tidying, and never answered meanwhile). ARGV: now
-- (µs, or '' for Redis's clock), 'one' and a reservation id, or 'newest'
-- and a count. Returns the live records asked for (newest first).
local now = clock_now(ARGV[1])
-- The account's state is 'held:next:tidy:gmax:gttl' (ledger_common.lua).
local state = redis.call('HGET', KEYS[3], 's')
local most = state and tonumber(string.match(state, '^[^:]*:[^:]*:[^:]*:([^:]*)') or '')
if ARGV[2] == 'one' then
  local expires = redis.call('ZSCORE', KEYS[2], ARGV[3])
  if not expires or tonumber(expires) <= now then return {} end
  if most and redis.call('ZREVRANK', KEYS[2], ARGV[3]) >= most then return {} end
  local record = redis.call('HGET', KEYS[1], ARGV[3])
  if not record then return {} end
  return { record }
end
local count = tonumber(ARGV[3])
if most and most < count then count = most end
if count <= 0 then return {} end
local ids = redis.call('ZREVRANGEBYSCORE', KEYS[2], '+inf', '(' .. int(now), 'LIMIT', 0, count)
if #ids == 0 then return {} end
local records = redis.call('HMGET', KEYS[1], unpack(ids))
local found = {}
for _, record in ipairs(records) do
  if record then table.insert(found, record) end
end
return found
