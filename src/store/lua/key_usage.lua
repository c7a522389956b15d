-- A key's usage in the current periods and its live reservations, once
-- the holds expired by now have lapsed (charged, as every ledger script
-- does).
-- KEYS: the account's five keys (as in ledger_write.lua: hash, holds zset,
-- amounts hash, generation records and their expiries),
-- then the key's five (usage hash, reservations zset, amounts hash, the
-- zset of settled and lapsed ids, the hash of lapse charges).
-- ARGV: now (µs, or '' for Redis's clock), how long (µs) a lapse is kept,
-- counter TTL slack (ms), the account's name, the key's name.
-- Returns the eight usage fields and the reserved sum, as decimal strings.
now = clock_now(ARGV[1])
lapse = tonumber(ARGV[2])
ACCT = { acct = KEYS[1], res = KEYS[2], amt = KEYS[3], gen = KEYS[4], genexp = KEYS[5],
  name = ARGV[4], lapse = lapse, slack_ms = tonumber(ARGV[3]) }
drop_expired(ACCT, now)
local k = { use = KEYS[6], res = KEYS[7], amt = KEYS[8], settled = KEYS[9], lapsed = KEYS[10], lapse = lapse, name = ARGV[5] }
drop_expired(k, now)
local reserved = live_reserved(k)
local starts = period_starts(now)
local f = redis.call('HMGET', k.use, unpack(USAGE_FIELDS))
local usage = {}
for p = 0, 3 do
  local own, byok = usage_in(f, 0, p, starts)
  table.insert(usage, own)
  table.insert(usage, byok)
end
table.insert(usage, big_str(reserved))
return usage
