-- Moves one key's ledger from layout 2 (or 1) into the ledger's, with every
-- gateway instance stopped: its usage and terms into the account's hash
-- (`k:<key>`, `t:<key>`, `r:<key>`), and its live holds into the
-- account's tracked ids, to lapse or be settled as any other. A covered
-- hold whose account side has lapsed already (its balance charged) is
-- charged on the key now, as its lapse would have been, and kept as
-- lapsed for a late settlement. Markers and lapse charges of the old
-- layout are dropped (no settlement is on its way: no instance runs).
-- KEYS: the account's hash and ids zset, then the key's five layout-2
-- keys (usage hash, holds zset, hold amounts hash, settled zset, lapse
-- charges hash), then the account's two (holds zset, amounts hash).
-- ARGV: the key's name, how long (µs) a lapse is kept. Returns how many
-- holds moved. Running it again moves nothing: the old keys are gone.
local A, X, key = KEYS[1], KEYS[2], ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- Its usage hash: usage fields, then `rv` and the terms (`tl tr tb tx`).
local names = { 't', 'bt', 'ds', 'd', 'bd', 'ws', 'w', 'bw', 'ms', 'm', 'bm', 'rv', 'tl', 'tr', 'tb', 'tx' }
local old = redis.call('HMGET', KEYS[3], unpack(names))
local usage = {}
for i = 1, 11 do usage[i] = old[i] or '' end
local fields, scores = {}, {}
if old[12] then
  table.insert(fields, 'r:' .. key)
  table.insert(fields, old[12])
end
if old[13] then
  table.insert(fields, 't:' .. key)
  table.insert(fields, old[13] .. ':' .. (old[14] or 'n') .. ':' .. (old[15] or '0') .. ':' .. (old[16] or ''))
end
local holds = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
local moved, key_held, account_held, next_expiry, charged = 0, '0', '0', nil, false
local moved_ids = {}
local current = period_starts(now)
for i = 1, #holds, 2 do
  local id, expiry = holds[i], tonumber(holds[i + 1])
  local value = redis.call('HGET', KEYS[5], id)
  -- 'amount', 'amount:c', 'amount:b' or 'amount:c|b:retention:most'.
  local amount, flag, retention, most
  if value then amount, flag, retention, most = string.match(value, '^(%d+):?([cb]?):?(%d*):?(%d*)$') end
  if amount then
    local on_account = redis.call('ZSCORE', KEYS[8], id)
    -- A hold layout 1 wrote says nothing: the balance covered it exactly
    -- when the account held it too (layout 1 never lapsed a hold).
    if flag == '' then flag = on_account and 'c' or 'b' end
    if flag == 'c' and not on_account then
      -- Own usage in the current periods (each period's sums start afresh
      -- when it has rolled), as a lapse charges it.
      usage[1] = add(usage[1], amount)
      for p = 1, 3 do
        local at = 3 * p
        if usage[at] == '' or tonumber(current[p]) > tonumber(usage[at]) then
          usage[at], usage[at + 1], usage[at + 2] = current[p], '0', '0'
        end
        if usage[at] == current[p] then usage[at + 1] = add(usage[at + 1], amount) end
      end
      local forget_at = now + tonumber(ARGV[2])
      table.insert(fields, 'i:' .. id)
      table.insert(fields, 'L:' .. int(forget_at) .. ':' .. amount .. ':0:' .. current[1] .. ':' .. current[2] .. ':' .. current[3] .. ':' .. key)
      table.insert(scores, int(-forget_at))
      table.insert(scores, id)
      charged = true
    else
      table.insert(fields, 'i:' .. id)
      table.insert(fields, 'H:' .. amount .. ':' .. flag .. ':' .. retention .. ':' .. most .. ':' .. key)
      table.insert(scores, int(expiry))
      table.insert(scores, id)
      key_held = add(key_held, amount)
      if flag == 'c' then account_held = add(account_held, amount) end
      if not next_expiry or expiry < next_expiry then next_expiry = expiry end
      moved = moved + 1
    end
    table.insert(moved_ids, id)
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 or moved > 0 or charged then
  -- Packed as the ledger keeps it (ledger_common.lua): the usage, then the
  -- key's live holds.
  table.insert(fields, 'k:' .. key)
  table.insert(fields, table.concat(usage, ':') .. ':' .. (moved > 0 and key_held or ''))
end
if moved > 0 then
  -- The account's state is 'held:next:tidy:gmax:gttl'.
  local state = redis.call('HGET', A, 's') or '::::'
  local held, earliest, rest = string.match(state, '^([^:]*):([^:]*):(.*)$')
  if earliest ~= '' and tonumber(earliest) < next_expiry then next_expiry = tonumber(earliest) end
  table.insert(fields, 's')
  table.insert(fields, add(held, account_held) .. ':' .. int(next_expiry) .. ':' .. rest)
end
-- Written only now, in slices (unpack() fails past a few thousand
-- values), and the old keys removed last: a run that fails writes nothing
-- of its own, and runs again from the start.
sliced('HSET', A, fields)
sliced('ZADD', X, scores)
sliced('ZREM', KEYS[8], moved_ids)
sliced('HDEL', KEYS[9], moved_ids)
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
return moved
