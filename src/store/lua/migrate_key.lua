-- Moves one key's ledger from layout 2 (or 1) into layout 3, with every
-- gateway instance stopped: its usage and terms into the account's hash
-- (`<key>:<field>`), and its live holds into the account's tracked ids,
-- to lapse or be settled as any other. Markers and lapse charges of the
-- old layout are dropped (no settlement is on its way: no instance runs).
-- KEYS: the account's hash and ids zset, then the key's five layout-2
-- keys (usage hash, holds zset, hold amounts hash, settled zset, lapse
-- charges hash), then the account's two (holds zset, amounts hash).
-- ARGV: the key's name. Returns how many holds moved. Running it again
-- moves nothing: the old keys are gone.
local A, X, key = KEYS[1], KEYS[2], ARGV[1]
local usage = redis.call('HGETALL', KEYS[3])
local fields = {}
for i = 1, #usage, 2 do
  -- The kept sums of older versions (`\255…`) are not fields of layout 3.
  if string.byte(usage[i], 1) ~= 255 then
    table.insert(fields, key .. ':' .. usage[i])
    table.insert(fields, usage[i + 1])
  end
end
local holds = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
local moved, key_held, account_held = 0, 0, 0
local next_expiry = tonumber(redis.call('HGET', A, 'next') or '')
for i = 1, #holds, 2 do
  local id, expiry = holds[i], tonumber(holds[i + 1])
  local value = redis.call('HGET', KEYS[5], id)
  if value then
    -- 'amount', 'amount:c', 'amount:b' or 'amount:c|b:retention:most'.
    local amount, flag, retention, most = string.match(value, '^(%d+):?([cb]?):?(%d*):?(%d*)$')
    if amount then
      if flag == '' then flag = 'c' end
      table.insert(fields, 'i:' .. id)
      table.insert(fields, 'H:' .. amount .. ':' .. flag .. ':' .. retention .. ':' .. most .. ':' .. key)
      redis.call('ZADD', X, int(expiry), id)
      key_held = key_held + tonumber(amount)
      if flag == 'c' then account_held = account_held + tonumber(amount) end
      if not next_expiry or expiry < next_expiry then next_expiry = expiry end
      moved = moved + 1
    end
  end
end
if #fields > 0 then redis.call('HSET', A, unpack(fields)) end
if moved > 0 then
  redis.call('HINCRBY', A, key .. ':h', int(key_held))
  redis.call('HINCRBY', A, 'held', int(account_held))
  redis.call('HSET', A, 'next', int(next_expiry))
end
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
return moved
