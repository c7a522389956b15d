-- Records a purchase once per purchase key. KEYS[1]: the account hash;
-- KEYS[2]: the key's record, a hash (amount, purchased, balance,
-- forget_at) in the account's slot. ARGV[1]: amount; ARGV[2] now in µs (''
-- for Redis's clock), ARGV[3] how long the key is remembered (µs),
-- ARGV[4] the record's Redis TTL (ms: that time plus slack, which only
-- reclaims memory; the record's own forget_at decides). The key is the
-- caller's (top_up_once) or a random one of the call's own (top_up), so
-- that the same call sent twice is credited once.
--
-- A key remembered answers {'repeated', purchased, balance} as they were
-- after its top-up, or {'reused', first amount} for another amount, and
-- records nothing; else the purchase answers {'credited', purchased,
-- balance} and is remembered. HINCRBY refuses to overflow without
-- writing; when the second one refuses, the first is undone, so a refused
-- top-up changes nothing.
local record = KEYS[2]
local now
if ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local first = redis.call('HMGET', record, 'amount', 'purchased', 'balance', 'forget_at')
if first[1] and first[4] and tonumber(first[4]) > now then
  -- Amounts are compared as the decimal integers Rust wrote.
  if first[1] == ARGV[1] then
    return {'repeated', first[2], first[3]}
  end
  return {'reused', first[1]}
end
local purchased = redis.pcall('HINCRBY', KEYS[1], 'purchased', ARGV[1])
if type(purchased) == 'table' and purchased.err then
  return 'overflow'
end
local balance = redis.pcall('HINCRBY', KEYS[1], 'balance', ARGV[1])
if type(balance) == 'table' and balance.err then
  redis.call('HINCRBY', KEYS[1], 'purchased', '-' .. ARGV[1])
  return 'overflow'
end
-- Read back as strings: HINCRBY's replies are Lua numbers (doubles),
-- inexact past 2^53.
local after = redis.call('HMGET', KEYS[1], 'purchased', 'balance')
redis.call('DEL', record)
redis.call('HSET', record, 'amount', ARGV[1], 'purchased', after[1], 'balance', after[2],
  'forget_at', int(now + tonumber(ARGV[3])))
redis.call('PEXPIRE', record, ARGV[4])
return {'credited', after[1], after[2]}
