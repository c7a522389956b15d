-- A newest-first page of a collection.
-- KEYS: values hash, revisions hash, creation-order zset.
-- ARGV: first and last rank (inclusive), worked out by the caller.
-- Returns {id, value, revision, id, value, revision, ...}.
local out = {}
for _, id in ipairs(redis.call('ZREVRANGE', KEYS[3], ARGV[1], ARGV[2])) do
  table.insert(out, id)
  table.insert(out, redis.call('HGET', KEYS[1], id))
  table.insert(out, redis.call('HGET', KEYS[2], id))
end
return out
