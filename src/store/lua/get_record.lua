-- A record. KEYS[1] values hash, KEYS[2] revisions hash. ARGV[1]: id.
-- Returns {value or false, revision or false}.
return { redis.call('HGET', KEYS[1], ARGV[1]), redis.call('HGET', KEYS[2], ARGV[1]) }
