-- A key's usage in the current periods and its live holds, once the
-- account's holds expired by now have lapsed (charged, as every ledger
-- call does).
-- KEYS: the account's four ledger keys (as in ledger_write.lua).
-- ARGV: now (µs, or '' for Redis's clock), how long (µs) a lapse is kept,
-- counter TTL slack (ms), the account's name, the key's name.
-- Returns the eight usage fields and the held sum, as decimal strings.
ledger_begin(KEYS, clock_now(ARGV[1]), 0, tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4])
local key = ARGV[5]
load({ 'balance', 's', 'k:' .. key })
sweep()
local usage = {}
for p = 0, 3 do
  local own, byok = usage_in(key, p)
  table.insert(usage, own)
  table.insert(usage, byok)
end
table.insert(usage, as_i64(text(kget(key, 'h'))))
ledger_end()
return usage
