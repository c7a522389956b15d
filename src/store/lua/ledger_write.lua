-- Every write to one account's ledger and counters: settles any number of
-- its requests, then, when asked, decides an admission (counter checks and
-- a credit hold together), all as one atomic step. So a request's rate
-- limits, free quota and hold are decided at once (a refusal by any of them
-- counts in none), and the settlements waiting for the account go along.
-- KEYS[1]: the account hash; KEYS[2], KEYS[3]: the account's holds zset
-- (id -> expiry µs) and their amounts hash; KEYS[4], KEYS[5]: the
-- account's generation records hash (id -> record) and their expiries zset
-- (id -> µs); then five keys per key ledger (usage hash, reservations
-- zset, amounts hash, the zset of ids settled without a granted hold and
-- of lapsed holds, the hash of lapse charges); then two keys per counter
-- check (see counters.lua).
-- ARGV: now (µs, or '' for Redis's clock), how long (µs) a settlement's
--   marker is kept,
--   how long (µs) a lapse is kept, key ledger count L, counter TTL slack
--   (ms), the account's name, then L key names (hashes), settlement count
--   N; then N times: ledger (1-based index of its keys), reservation id,
--   cost, byok (0/1), generation record ('' for none),
--   how long it is kept (µs), the most records the account keeps; then
--   renewal count R, the renewed holds' lifetime (µs) and key TTL (ms),
--   and R times: ledger, reservation id; then, when an admission follows,
--   counter count C and C times the four arguments of a check; then the
--   purchase tier: index of the check it raises (0 for none), purchased
--   threshold, raised capacity; then, when a hold follows: ledger,
--   reservation id, amount, least amount ('' for exactly the amount),
--   lifetime (µs), key TTL (ms), has limit (0/1), limit, reset ('n' never,
--   'd', 'w', 'm'), include BYOK (0/1), check balance (0/1), covered by
--   balance (0/1), counts against the key's limit (0/1), lapse record
--   retention (µs, '' for none), most records.
-- Returns, with neither counters nor a hold, {settlements recorded, holds
-- renewed}.
-- Otherwise {status, now, a, b, c, then six per check: fits, used,
-- remaining, retry µs, reset µs, capacity}; status 0 admitted (a used, b
-- the key's holds, c held), 1 over the key limit (a used with holds),
-- 2 balance negative (a balance), 3 balance short (a balance, b the
-- account's holds), 4 a counter refused, 5 the key is revoked (its usage
-- hash has `rv`). Amounts are decimal strings.
now = clock_now(ARGV[1])
local memory = tonumber(ARGV[2])
lapse = tonumber(ARGV[3])
local ledger_count = tonumber(ARGV[4])
local slack_ms = tonumber(ARGV[5])
ACCT = { acct = KEYS[1], res = KEYS[2], amt = KEYS[3], gen = KEYS[4], genexp = KEYS[5],
  name = ARGV[6], lapse = lapse, slack_ms = slack_ms }
local acct = ACCT
-- The account's expired holds lapse first: a key's lapse asks whether the
-- account held it.
drop_expired(ACCT, now)
-- The current periods' starts, worked out when first needed (an admission
-- of a key whose limit never resets needs none).
local current_starts
local function starts()
  if not current_starts then current_starts = period_starts(now) end
  return current_starts
end

-- Each key ledger once per call: its expired reservations lapsed.
local ledgers = {}
local function ledger(index)
  local k = ledgers[index]
  if k then return k end
  local base = 5 + (tonumber(index) - 1) * 5
  k = { use = KEYS[base + 1], res = KEYS[base + 2], amt = KEYS[base + 3], settled = KEYS[base + 4],
    lapsed = KEYS[base + 5], lapse = lapse, name = ARGV[6 + tonumber(index)] }
  drop_expired(k, now)
  ledgers[index] = k
  return k
end

-- Records a request's real cost and releases its holds, once per
-- reservation id: its marker in `k.settled` (kept `memory` µs, longer
-- than any retry of it can come) is written in the same step as its cost,
-- and a settlement that finds it records nothing. One that finds neither
-- its hold nor its marker (a hold Redis lost with its data) still records
-- its cost: lost data costs a late charge, never a free request. One that
-- finds its lapsed hold replaces the lapse's charge. Returns 1 when
-- recorded, 0 when the id was settled already.
local function settle(k, id, cost, byok)
  -- Markers and lapses whose time is up are forgotten first.
  forget_settled(k, now)
  -- Released even when settled already: a late admission of a request
  -- given up on must not leave a hold behind.
  release(k, id)
  redis.call('ZREM', k.res, id)
  release(acct, id)
  redis.call('ZREM', acct.res, id)
  if tonumber(redis.call('ZSCORE', k.settled, id) or '0') > now then return 0 end
  redis.call('ZADD', k.settled, int(now + memory), id)
  keep_settled_for(k, math.ceil(memory / 1000))
  -- A lapse's charge gives way to the real cost; its record too, to the
  -- settlement's or (never sent) to none.
  if undo_lapse(k, id) then
    redis.call('HDEL', ACCT.gen, id)
    redis.call('ZREM', ACCT.genexp, id)
  end
  add_usage(k, cost, byok)
  -- '-0' is not an integer to Redis, so a zero cost skips the balance.
  if not byok and cost ~= '0' then redis.call('HINCRBY', KEYS[1], 'balance', '-' .. cost) end
  return 1
end

-- The live holds of `k` other than `id`'s, and how many: what a new hold
-- of `id` adds to.
local function holds_besides(k, id)
  local reserved, holds, previous = live_reserved(k, id)
  if previous then
    local held = big(amount_of(previous))
    if not big_ge(reserved, held) then
      -- A kept sum that no longer matches its holds: count them again.
      redis.call('HDEL', k.amt, TOTAL, COUNT)
      reserved, holds = live_reserved(k)
    end
    reserved, holds = big_sub(reserved, held), holds - 1
  end
  return reserved, holds
end

-- Holds `amount` (big) for `id` in `k` on top of `others` (its other
-- holds, `count` of them) until `expires_at`.
local function put_hold(k, id, amount, others, count, expires_at, key_ttl, suffix)
  local total = big_add(others, amount)
  local added = redis.call('HSET', k.amt, id, big_str(amount) .. (suffix or ''), TOTAL, big_str(total), COUNT, int(count + 1))
  redis.call('ZADD', k.res, int(expires_at), id)
  -- Hold keys outlive their last hold by ORPHAN_HOLD_MS: a hold whose
  -- instance died is still there, to lapse, at the account's next call.
  key_ttl = key_ttl + ORPHAN_HOLD_MS
  -- Only ever extended: a shorter TTL must not cut a longer hold. A kept
  -- sum written afresh (the amounts hash emptied by a recount, and so
  -- perhaps new) has its own lifetime set too.
  keep_alive(key_ttl, k.res, k.amt, added >= 2)
  return total
end

local function big_min(a, b) if big_ge(a, b) then return b end return a end
local function is_zero(a) return a[1] == 0 and a[2] == 0 end

-- Decides the hold whose arguments start after ARGV[a], for the key whose
-- usage hash read `usage` (KEY_FIELDS, then USAGE_FIELDS): refuses on the
-- key limit (its own terms once set, else the request's), a negative
-- balance or (covered by balance) a balance that the account's holds leave
-- short; else holds as much of the amount as the limit and balance allow,
-- at least the least amount.
local function hold(k, a, usage)
  local id = ARGV[a + 1]
  local amount = big(ARGV[a + 2])
  local least = amount
  if ARGV[a + 3] ~= '' then least = big(ARGV[a + 3]) end
  local expires_at = now + tonumber(ARGV[a + 4])
  local key_ttl = tonumber(ARGV[a + 5])
  local reserved, holds = holds_besides(k, id)
  local has_limit, limit_text, reset, include_byok = ARGV[a + 6] == '1', ARGV[a + 7], ARGV[a + 8], ARGV[a + 9] == '1'
  if usage[2] then
    has_limit, limit_text, reset, include_byok = usage[2] ~= '-', usage[2], usage[3], usage[4] == '1'
  end
  -- BYOK usage the key's limit leaves out is bounded by no limit (and its
  -- usage is answered all time, own only).
  if ARGV[a + 12] == '0' then has_limit, reset, include_byok = false, 'n', false end
  local p = ({ n = 0, d = 1, w = 2, m = 3 })[reset]
  local own, byok = usage_in(usage, #KEY_FIELDS, p, p > 0 and starts() or nil)
  local used = big(own)
  if include_byok then used = big_add(used, big(byok)) end
  -- Its settlement came first (the caller gave up on it): the request was
  -- never sent, and nothing must stay held.
  local known = tonumber(redis.call('ZSCORE', k.settled, id) or '0')
  if known > now then
    local live = live_reserved(k)
    return { 0, big_str(used), big_str(live), '0' }
  end
  local committed = big_add(used, reserved)
  local grant = amount
  if has_limit then
    local limit = big(limit_text)
    -- A request that holds nothing is refused once usage has reached the
    -- limit; one that holds, when even its least amount would pass it.
    if is_zero(least) then
      if big_ge(committed, limit) then return { 1, big_str(committed), limit_text, reset } end
      grant = big_min(grant, big_sub(limit, committed))
    else
      if not big_ge(limit, big_add(committed, least)) then return { 1, big_str(committed), limit_text, reset } end
      grant = big_min(grant, big_sub(limit, committed))
    end
  end
  local covered = ARGV[a + 11] == '1'
  local account_held, account_holds
  if ARGV[a + 10] == '1' or covered then
    local balance = redis.call('HGET', KEYS[1], 'balance') or '0'
    if string.sub(balance, 1, 1) == '-' then return { 2, balance } end
    if covered then
      account_held, account_holds = holds_besides(acct, id)
      local available = big(balance)
      if not big_ge(available, big_add(account_held, least)) then
        return { 3, balance, big_str(account_held) }
      end
      grant = big_min(grant, big_sub(available, account_held))
    end
  end
  -- A key's hold says whether the balance holds it too (its lapse is then
  -- own usage, else BYOK) and, when its lapse leaves a generation record,
  -- how that is kept.
  local suffix = covered and ':c' or ':b'
  if ARGV[a + 13] ~= '' then suffix = suffix .. ':' .. ARGV[a + 13] .. ':' .. ARGV[a + 14] end
  local total = put_hold(k, id, grant, reserved, holds, expires_at, key_ttl, suffix)
  if covered then put_hold(acct, id, grant, account_held, account_holds, expires_at, key_ttl, nil) end
  return { 0, big_str(used), big_str(total), big_str(grant) }
end

-- The settlements first, so the admission sees their costs and not their holds.
local count = tonumber(ARGV[7 + ledger_count])
local recorded = 0
local first = 8 + ledger_count
for i = 0, count - 1 do
  local a = first + i * 7
  local new = settle(ledger(ARGV[a]), ARGV[a + 1], ARGV[a + 2], ARGV[a + 3] == '1')
  -- A record goes with the first settlement of its id only, as its cost does.
  if new == 1 and ARGV[a + 4] ~= '' then
    keep_generation(ARGV[a + 1], ARGV[a + 4], tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]))
  end
  recorded = recorded + new
end
-- Then the renewals: each live hold lasts `lifetime` from now, on the key
-- and on the account (never shortened).
local r = first + count * 7
local renewals = tonumber(ARGV[r])
local renewed = 0
if renewals > 0 then
  local expires_at = now + tonumber(ARGV[r + 1])
  local key_ttl = tonumber(ARGV[r + 2]) + ORPHAN_HOLD_MS
  for i = 0, renewals - 1 do
    local k = ledger(ARGV[r + 3 + i * 2])
    local id = ARGV[r + 4 + i * 2]
    -- Lapses whose time is up are forgotten first: a renewal never brings
    -- one back.
    forget_settled(k, now)
    local expiry = redis.call('ZSCORE', k.res, id)
    if expiry then
      renewed = renewed + 1
      if tonumber(expiry) < expires_at then
        redis.call('ZADD', k.res, 'XX', int(expires_at), id)
        redis.call('ZADD', acct.res, 'XX', int(expires_at), id)
        keep_alive(key_ttl, k.res, k.amt)
        keep_alive(key_ttl, acct.res, acct.amt)
      end
    elseif redis.call('HEXISTS', k.lapsed, id) == 1 then
      -- Lapsed while its request goes on (its instance lost the store for
      -- longer than the hold): its charge is kept for its settlement.
      redis.call('ZADD', k.settled, 'XX', int(-(now + lapse)), id)
      keep_settled_for(k, math.ceil(lapse / 1000))
      if redis.call('PTTL', k.lapsed) < math.ceil(lapse / 1000) then redis.call('PEXPIRE', k.lapsed, math.ceil(lapse / 1000)) end
    end
  end
end
local c = r + 3 + renewals * 2
-- Settlements and renewals alone: nothing follows them.
if ARGV[c] == nil then return { recorded, renewed } end
local checks = tonumber(ARGV[c])
local tier = c + checks * 4
local h = tier + 3

local capacities = {}
local raised = tonumber(ARGV[tier + 1])
if raised > 0 then
  local purchased = big(redis.call('HGET', KEYS[1], 'purchased') or '0')
  if big_ge(purchased, big(ARGV[tier + 2])) then capacities[raised] = tonumber(ARGV[tier + 3]) end
end
local counter_keys = 5 + ledger_count * 5
local function reply(head, outcomes)
  for _, o in ipairs(outcomes) do
    for j = 1, 6 do table.insert(head, o[j]) end
  end
  return head
end
local fit, states = counters_check(now, checks, counter_keys, c, capacities)
-- The held key's usage hash, read once: KEY_FIELDS, then USAGE_FIELDS.
local usage = ARGV[h + 1] ~= nil and redis.call('HMGET', ledger(ARGV[h + 1]).use, unpack(KEY_FIELDS_AND_USAGE))
-- A revoked key is refused first, whatever its counters say; then one past
-- its expiry by this clock.
if usage and usage[1] then
  return reply({ 5, int(now), '0', '0', '0' }, counters_outcomes(states))
end
if usage and usage[5] and usage[5] ~= '' and tonumber(usage[5]) <= now then
  return reply({ 6, int(now), usage[5], '0', '0' }, counters_outcomes(states))
end
if not fit then return reply({ 4, int(now), '0', '0', '0' }, counters_outcomes(states)) end
local decided = { 0, '0', '0', '0' }
if usage then
  decided = hold(ledger(ARGV[h + 1]), h + 1, usage)
  if decided[1] ~= 0 then
    return reply({ decided[1], int(now), decided[2] or '0', decided[3] or '0', decided[4] or '0' }, counters_outcomes(states))
  end
end
counters_commit(now, slack_ms, states)
return reply({ 0, int(now), decided[2], decided[3], decided[4] }, counters_outcomes(states))
