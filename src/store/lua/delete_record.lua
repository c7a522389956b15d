-- Deletes a record when the expectation holds. KEYS and ARGV as put_record
-- (without the value: ARGV[2] is unused).
local current = redis.call('HMGET', KEYS[1], 'rev', 'v')
local revision = current[1]
local holds = ARGV[3] == 'any'
  or (ARGV[3] == 'absent' and not revision)
  or (ARGV[3] == 'rev' and revision == ARGV[4])
if not holds then return { 0, revision, current[2] } end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return { 1, 0 }
