-- Records a purchase. KEYS[1]: the account hash. ARGV[1]: amount.
redis.call('HINCRBY', KEYS[1], 'purchased', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'balance', ARGV[1])
return redis.call('HMGET', KEYS[1], 'purchased', 'balance')
