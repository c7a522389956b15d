-- Records a purchase. KEYS[1]: the account hash. ARGV[1]: amount.
-- HINCRBY refuses to overflow without writing; when the second one
-- refuses, the first is undone, so a refused top-up changes nothing.
local purchased = redis.pcall('HINCRBY', KEYS[1], 'purchased', ARGV[1])
if type(purchased) == 'table' and purchased.err then
  return 'overflow'
end
local balance = redis.pcall('HINCRBY', KEYS[1], 'balance', ARGV[1])
if type(balance) == 'table' and balance.err then
  redis.call('HINCRBY', KEYS[1], 'purchased', '-' .. ARGV[1])
  return 'overflow'
end
return redis.call('HMGET', KEYS[1], 'purchased', 'balance')
