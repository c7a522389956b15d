-- A newest-first page of a collection. KEYS[1]: the creation-order zset.
-- ARGV: the prefix of the collection's record keys, offset, limit.
-- Record keys share the zset's hash tag, so they live in its Cluster slot.
-- Returns {id, value, revision, id, value, revision, ...}.
local ids = redis.call('ZREVRANGE', KEYS[1], ARGV[2], tonumber(ARGV[2]) + tonumber(ARGV[3]) - 1)
local out = {}
for _, escaped in ipairs(ids) do
  local record = redis.call('HMGET', ARGV[1] .. escaped, 'id', 'v', 'rev')
  if record[1] then
    table.insert(out, record[1])
    table.insert(out, record[2])
    table.insert(out, record[3])
  end
end
return out
