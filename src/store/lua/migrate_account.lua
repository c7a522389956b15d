-- Ends an account's move from layout 2 (or 1), once every key of it has moved
-- (migrate_key.lua): the holds on its balance left in the old layout
-- belong to keys no longer listed (deleted), whose requests ended with
-- their instances; each is charged to the balance now, as its lapse
-- would have been. KEYS: the account's hash, then its two layout-2 keys
-- (holds zset, amounts hash). Returns how many were charged.
local holds = redis.call('HGETALL', KEYS[3])
local balance = redis.call('HGET', KEYS[1], 'balance') or '0'
local charged = 0
for i = 1, #holds, 2 do
  local amount = string.match(holds[i + 1], '^(%d+)')
  if amount and string.byte(holds[i], 1) ~= 255 then
    balance = signed_add(balance, amount, true)
    charged = charged + 1
  end
end
if charged > 0 then redis.call('HSET', KEYS[1], 'balance', balance) end
redis.call('DEL', KEYS[2], KEYS[3])
return charged
