-- Moves one key's ledger from layout 2 (or 1) into layout 3, with every
-- gateway instance stopped: its usage and terms into the account's hash
-- (`k:<key>`, `t:<key>`, `r:<key>`), and its live holds into the account's tracked ids,
-- to lapse or be settled as any other. Markers and lapse charges of the
-- old layout are dropped (no settlement is on its way: no instance runs).
-- KEYS: the account's hash and ids zset, then the key's five layout-2
-- keys (usage hash, holds zset, hold amounts hash, settled zset, lapse
-- charges hash), then the account's two (holds zset, amounts hash).
-- ARGV: the key's name. Returns how many holds moved. Running it again
-- moves nothing: the old keys are gone.
local A, X, key = KEYS[1], KEYS[2], ARGV[1]
-- Its usage hash: usage fields, then `rv` and the terms (`tl tr tb tx`).
local names = { 't', 'bt', 'ds', 'd', 'bd', 'ws', 'w', 'bw', 'ms', 'm', 'bm', 'rv', 'tl', 'tr', 'tb', 'tx' }
local old = redis.call('HMGET', KEYS[3], unpack(names))
local fields = {}
local usage = {}
for i = 1, 11 do usage[i] = old[i] or '' end
if redis.call('EXISTS', KEYS[3]) == 1 then
  -- Packed as layout 3 keeps it (see ledger_common.lua); the held sum
  -- (the twelfth part) is the holds moved below.
  table.insert(fields, 'k:' .. key)
  table.insert(fields, table.concat(usage, ':') .. ':')
end
if old[12] then
  table.insert(fields, 'r:' .. key)
  table.insert(fields, old[12])
end
if old[13] then
  table.insert(fields, 't:' .. key)
  table.insert(fields, old[13] .. ':' .. (old[14] or 'n') .. ':' .. (old[15] or '0') .. ':' .. (old[16] or ''))
end
local holds = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
local moved, key_held, account_held = 0, 0, 0
local next_expiry
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
if moved > 0 then
  if #fields == 0 or fields[1] ~= 'k:' .. key then
    table.insert(fields, 'k:' .. key)
    table.insert(fields, '::::::::::::')
  end
  -- The key's held sum is its packed usage's last part; the account's
  -- state is 'held:next:tidy:gmax:gttl'.
  fields[2] = string.gsub(fields[2], ':[^:]*$', ':' .. int(key_held))
  local state = redis.call('HGET', A, 's') or '::::'
  local held, rest_next, rest = string.match(state, '^([^:]*):([^:]*):(.*)$')
  local total = tonumber(held ~= '' and held or '0') + account_held
  local earliest = next_expiry
  if rest_next ~= '' and tonumber(rest_next) < earliest then earliest = tonumber(rest_next) end
  table.insert(fields, 's')
  table.insert(fields, int(total) .. ':' .. int(earliest) .. ':' .. rest)
end
if #fields > 0 then redis.call('HSET', A, unpack(fields)) end
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
return moved
