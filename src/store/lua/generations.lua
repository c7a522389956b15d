-- Reads an account's generation records. KEYS[1]: records hash (id ->
-- record), KEYS[2]: their expiries zset (id -> µs), KEYS[3]: the account's
-- ledger hash (the cap in its state `s`: records past the newest that many are removed
-- at the account's next tidying, and never answered meanwhile); for a
-- key's page, KEYS[4]: the key's own order (ledger_common.lua's
-- keep_key_orders). ARGV: now (µs, or '' for Redis's clock), then 'one'
-- and a reservation id, or 'page', a count and how many to skip. Returns
-- the live records asked for (newest first). With 'order' (KEYS[4] then
-- the account's mark), it puts a chunk of older records in their keys'
-- orders instead (RedisStore::ensure_key_orders).
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
local count, skip = tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[2] == 'order' then
  -- Puts the `count` records from rank `skip` (newest first) in their
  -- keys' orders, kept as long as the account's records; the last chunk
  -- (fewer than `count`) marks the account (KEYS[4]) done. Returns how
  -- many records it read.
  local entries = redis.call('ZREVRANGE', KEYS[2], skip, skip + count - 1, 'WITHSCORES')
  local ids, scores = {}, {}
  for j = 1, #entries, 2 do
    table.insert(ids, entries[j])
    table.insert(scores, entries[j + 1])
  end
  if #ids > 0 then
    local ttl_ms = redis.call('PTTL', KEYS[2])
    local records = redis.call('HMGET', KEYS[1], unpack(ids))
    local orders = {}
    for i = 1, #ids do
      local key = records[i] and string.match(records[i], '"key_hash":"([^"]*)"')
      if key then
        local order = KEYS[2] .. ':' .. key
        redis.call('ZADD', order, scores[i], ids[i])
        orders[order] = true
      end
    end
    if ttl_ms > 0 then
      for order in pairs(orders) do
        if redis.call('PEXPIRE', order, ttl_ms, 'GT') == 0 then
          redis.call('PEXPIRE', order, ttl_ms, 'NX')
        end
      end
    end
  end
  if #ids < count then redis.call('SET', KEYS[4], '1') end
  return #ids
end
local ids
if not KEYS[4] then
  if most then count = math.min(count, most - skip) end
  if count <= 0 then return {} end
  ids = redis.call('ZREVRANGEBYSCORE', KEYS[2], '+inf', '(' .. int(now), 'LIMIT', skip, count)
else
  if count <= 0 then return {} end
  -- Past the cap, the records older than the newest `most`'s oldest wait
  -- for the account's next tidying unseen.
  local edge_id, edge = nil, nil
  if most and redis.call('ZCARD', KEYS[2]) > most then
    local oldest_kept = redis.call('ZREVRANGE', KEYS[2], most - 1, most - 1, 'WITHSCORES')
    edge_id, edge = oldest_kept[1], tonumber(oldest_kept[2])
  end
  local low = '(' .. int(now)
  if edge and edge > now then low = int(edge) end
  local entries = redis.call('ZREVRANGEBYSCORE', KEYS[4], '+inf', low, 'WITHSCORES', 'LIMIT', skip, count)
  ids = {}
  for j = 1, #entries, 2 do
    if not (edge and tonumber(entries[j + 1]) == edge and entries[j] < edge_id) then
      table.insert(ids, entries[j])
    end
  end
end
if #ids == 0 then return {} end
local records = redis.call('HMGET', KEYS[1], unpack(ids))
local found = {}
for _, record in ipairs(records) do
  if record then table.insert(found, record) end
end
return found
