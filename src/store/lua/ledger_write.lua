-- Every write to one account's ledger and counters: settles any number of
-- its requests, renews holds, then, when asked, decides an admission
-- (counter checks and a credit hold together), all as one atomic step. So
-- a request's rate limits, free quota and hold are decided at once (a
-- refusal by any of them counts in none), and the settlements waiting for
-- the account go along.
-- KEYS: the account's hash, its ids zset, its generation records hash and
-- their expiries zset (see ledger_common.lua); then two keys per counter
-- check (see counters.lua).
-- ARGV: now (µs, or '' for Redis's clock), how long (µs) a settlement's
--   marker is kept, how long (µs) a lapse is kept, counter TTL slack (ms),
--   the account's name, settlement count N; then N times: key, reservation
--   id, cost, byok (0/1), generation record ('' for none), how long it is
--   kept (µs), the most records the account keeps; then renewal count R,
--   the renewed holds' lifetime (µs), and R times: key, reservation id;
--   then, when an admission follows, counter count C and C times the four
--   arguments of a check; then the purchase tier: index of the check it
--   raises (0 for none), purchased threshold, raised capacity; then, when
--   a hold follows: key, reservation id, amount, least amount ('' for
--   exactly the amount), lifetime (µs), has limit (0/1), limit, reset ('n'
--   never, 'd', 'w', 'm'), include BYOK (0/1), check balance (0/1),
--   covered by balance (0/1), counts against the key's limit (0/1), lapse
--   record retention (µs, '' for none), most records, the model the lapse
--   record names ('' for none).
-- Returns, with neither counters nor a hold, {settlements recorded, holds
-- renewed}.
-- Otherwise {status, now, a, b, c, then six per check: fits, used,
-- remaining, retry µs, reset µs, capacity}; status 0 admitted (a used, b
-- the key's holds, c held), 1 over the key limit (a used with holds, b the
-- limit, c its reset), 2 balance negative (a balance), 3 balance short (a
-- balance, b the account's holds), 4 a counter refused, 5 the key is
-- revoked, 6 the key has expired (a its expiry).
local now = clock_now(ARGV[1])

-- Where each part of ARGV starts.
local count = num(ARGV[6])
local first = 7
local r = first + count * 7
local renewals = num(ARGV[r])
local c = r + 2 + renewals * 2
local admission = ARGV[c] ~= nil
local checks, tier, h
if admission then
  checks = num(ARGV[c])
  tier = c + checks * 4
  h = tier + 3
  if ARGV[h + 1] == nil then h = nil end
end

-- The capacities the purchase tier raises, when the account has bought
-- `purchased` (its field).
local function tier_capacities(purchased)
  local raised = num(ARGV[tier + 1])
  if raised > 0 and ge(purchased, ARGV[tier + 2]) then return { [raised] = num(ARGV[tier + 3]) } end
  return EMPTY
end
-- Appends to `names`, after its first `n`, the fields holding the GCRA
-- counters' state (see counters.lua); returns the new count.
local function gcra_fields(names, n)
  for i = 1, checks do
    if ARGV[c + 4 * i - 3] == 'g' then
      n = n + 1
      names[n] = KEYS[4 + 2 * i - 1]
    end
  end
  return n
end
local function reply(head, states)
  counters_outcomes(states, head, 6)
  return head
end
-- The reply to a refusal {status, a, b, c} (absent values '0'; see above).
local function refusal(refused, states)
  return reply({ refused[1], int(now), refused[2] or '0', refused[3] or '0', refused[4] or '0' }, states)
end

-- The terms the hold whose arguments start after ARGV[h] is decided on,
-- the key's stored terms (see terms_of) first: whether it has a limit, the
-- limit, its reset ('n' never) and whether BYOK usage counts.
local function limit_terms(stored_limit, stored_reset, stored_byok)
  local has_limit, limit_text, reset, include_byok = ARGV[h + 6] == '1', ARGV[h + 7], ARGV[h + 8], ARGV[h + 9] == '1'
  if stored_limit then
    has_limit, limit_text, reset, include_byok = stored_limit ~= '-', stored_limit, stored_reset, stored_byok == '1'
  end
  -- BYOK usage the key's limit leaves out is bounded by no limit (and its
  -- usage is answered all time, own only).
  if ARGV[h + 12] == '0' then has_limit, reset, include_byok = false, 'n', false end
  return has_limit, limit_text, reset, include_byok
end

-- How much the hold after ARGV[h] is granted, on its key's terms, the
-- key's usage `used` (in the limit's period) and holds `reserved`, and the
-- account's `balance` and holds the balance covers (`account_held`, read
-- only when the hold is covered): nil and the grant, or the refusal, as
-- {status, a, b, c} (see the reply above). It is refused on the key limit,
-- a negative balance or (covered by balance) a balance that the account's
-- holds leave short; else granted as much of the amount as the limit and
-- balance allow, at least the least amount.
local function grant_of(used, reserved, has_limit, limit_text, reset, balance, account_held)
  local amount = ARGV[h + 3]
  local least = amount
  if ARGV[h + 4] ~= '' then least = ARGV[h + 4] end
  local committed = add_held(used, reserved)
  local grant = amount
  if has_limit then
    -- A request that holds nothing is refused once usage has reached the
    -- limit; one that holds, when even its least amount would pass it.
    if least == '0' then
      if ge(committed, limit_text) then return { 1, as_i64(committed), limit_text, reset } end
    elseif not ge(limit_text, add_held(committed, least)) then
      return { 1, as_i64(committed), limit_text, reset }
    end
    grant = minimum(grant, less(limit_text, committed))
  end
  if ARGV[h + 10] == '1' or ARGV[h + 11] == '1' then
    if string.sub(balance, 1, 1) == '-' then return { 2, balance } end
    if ARGV[h + 11] == '1' then
      if not ge(balance, add_held(account_held, least)) then
        return { 3, balance, as_i64(account_held) }
      end
      grant = minimum(grant, less(balance, account_held))
    end
  end
  return nil, grant
end

-- The value of a hold granted `grant` on `key` (see ledger_common.lua),
-- its parts remembered for its settlement.
local function hold_value(grant, key)
  local retention = ARGV[h + 13]
  local model = retention ~= '' and ARGV[h + 15] or ''
  local covered = ARGV[h + 11] == '1'
  local admitted, flag = int(now), covered and 'c' or 'b'
  local most = retention ~= '' and ARGV[h + 14] or ''
  local value
  if model == '' then
    value = 'A:' .. admitted .. ':' .. grant .. ':' .. flag .. ':' .. retention .. ':' .. most .. ':' .. key
    model = nil
  else
    value = 'B:' .. admitted .. ':' .. grant .. ':' .. flag .. ':' .. retention .. ':' .. most .. ':' .. int(#model)
      .. ':' .. model .. key
  end
  remember_hold(value, { grant, covered, retention, most, key, admitted, model })
  return value
end

-- Most calls are an admission, carrying none or a few settlements of
-- holds its key took a moment ago, or such settlements alone, on an
-- account that needs no upkeep now: this decides those with one HMGET
-- and writes them with one HSET and one ZADD (and the counters' and
-- records' own commands), without the bookkeeping below, whose tables and
-- calls cost more here than the decision (see int.lua). Only when no hold
-- has expired, no tidying is due, an admitted id is new and its key is
-- neither revoked nor expired, and each settlement is, once in the call,
-- of a live hold of that key (the first settlement's, alone) admitted at
-- a known instant with no lapse before it: then it settles and decides as
-- below, on the same state, and a refusal writes the settlements alone
-- there too. Returns nil, having written nothing, otherwise.
local function at_once()
  if renewals ~= 0 or count > 32 or (admission and not h) or (not admission and count == 0) then return nil end
  -- Settlements alone are of the first one's key; their call names it in
  -- place of the admission's request.
  local key = h and ARGV[h + 1] or ARGV[first]
  local id = h and ARGV[h + 2]
  local usage_field = field('k:', key)
  local request = h and field('i:', id) or usage_field
  local names = { 'balance', 'purchased', 's', request, usage_field, field('t:', key), field('r:', key) }
  local n = 7
  local recording = false
  for a = first, first + (count - 1) * 7, 7 do
    if ARGV[a] ~= key then return nil end
    local settled = ARGV[a + 1]
    names[n + 1], names[n + 2] = field('i:', settled), field('l:', settled)
    n = n + 2
    if ARGV[a + 4] ~= '' then recording = true end
  end
  -- Until when the key's own order of records is known to live.
  local order_known = recording and n + 1
  if recording then
    n = n + 1
    names[n] = field('o:', key)
  end
  READ_FIELDS.first = n + 1
  local read = redis.call('HMGET', KEYS[1], unpack(names, 1, h and gcra_fields(names, n) or n))
  if not read[3] or (h and (read[4] or read[7])) then return nil end
  local s = unpacked(read[3], STATE_PATTERN, 5)
  local next_expiry, tidy_at = s[STATE_SLOTS.next], s[STATE_SLOTS.tidy]
  if not tidy_at or num(tidy_at) <= now or (next_expiry and num(next_expiry) <= now) then return nil end
  local stored_limit, stored_reset, stored_byok, expiry = terms_of(read[6])
  if h and expiry and expiry ~= '' and num(expiry) <= now then return nil end
  -- The key's usage, a copy: the remembered parts stay as they are.
  local u = read[5] and unpacked(read[5], KEY_PATTERN, 12) or NO_USAGE
  local usage = { u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12] }
  local balance, held, most, gttl = read[1], s[STATE_SLOTS.held], s[STATE_SLOTS.gmax], s[STATE_SLOTS.gttl]
  -- What the HSET and the ZADD write, and the records kept.
  -- Sized whole for one settlement and an admission: a table grown a
  -- value at a time is rehashed at each power of two.
  local written = { usage_field, false, false, false, false, false, false, false, false, false, false, false }
  local scores, records, wn, sn = { false, false, false, false }, nil, 2, 0
  -- As settle below does, for these.
  local seen = count > 1 and {} or EMPTY
  local forget_at = int(now + num(ARGV[2]))
  local settled_score = int(-(now + num(ARGV[2])))
  for i = 0, count - 1 do
    local a, value = first + i * 7, read[8 + 2 * i]
    local settled = ARGV[a + 1]
    if not holds(value) or read[9 + 2 * i] or seen[settled] then return nil end
    local amount, covered, _, _, its_key, admitted = hold_parts(value)
    if its_key ~= key or not admitted then return nil end
    if count > 1 then seen[settled] = true end
    admitted = num(admitted)
    local charged_in = fdiv(admitted, DAY_US) == fdiv(now, DAY_US) and starts_on(now) or period_starts(admitted)
    usage[12] = less(usage[12], amount)
    if covered then held = less(held, amount) end
    local cost, byok = ARGV[a + 2], ARGV[a + 3] == '1'
    add_usage_to(usage, cost, byok, charged_in)
    if not byok and cost ~= '0' then balance = signed_add(balance, cost, true) end
    written[wn + 1], written[wn + 2], wn = names[8 + 2 * i], 'S:' .. forget_at, wn + 2
    scores[sn + 1], scores[sn + 2], sn = settled_score, settled, sn + 2
    if ARGV[a + 4] ~= '' then
      local retention = num(ARGV[a + 5])
      records = records or {}
      records[settled] = { ARGV[a + 4], int(now + retention), retention, key }
      most = ARGV[a + 6]
    end
  end
  READ_FIELDS.names, READ_FIELDS.values, READ_FIELDS.count = names, read, 0
  local states, refused, grant, used
  if h then
    local fit
    fit, states = counters_check(now, checks, 4, c, tier_capacities(read[2]), READ_FIELDS)
    if not fit then
      refused = { 4 }
    else
      local has_limit, limit_text, reset, include_byok = limit_terms(stored_limit, stored_reset, stored_byok)
      local p = PERIOD_INDEX[reset]
      local byok
      used, byok = period_usage(usage, p, p ~= 0 and starts_on(now))
      if include_byok then used = add(used, byok) end
      refused, grant = grant_of(used, usage[12], has_limit, limit_text, reset, balance or '0', text(held))
    end
    if refused and count == 0 then return refusal(refused, states) end
    if not refused then
      usage[12] = add_held(usage[12], grant)
      local expires_at = now + num(ARGV[h + 5])
      if ARGV[h + 11] == '1' then held = add_held(held, grant) end
      if not next_expiry or num(next_expiry) > expires_at then next_expiry = int(expires_at) end
      -- In the general path's order: the counters, then the hold.
      counters_commit(now, num(ARGV[4]), states, READ_FIELDS)
      written[wn + 1], written[wn + 2], wn = request, hold_value(grant, key), wn + 2
      scores[sn + 1], scores[sn + 2], sn = int(expires_at), id, sn + 2
    end
  end
  if records then
    local extended = {}
    gttl = keep_records(records, gttl, now, num(ARGV[4]), KEYS[3], KEYS[4], { [key] = read[order_known] }, extended)
      or gttl
    if extended[key] then written[wn + 1], written[wn + 2], wn = names[order_known], extended[key], wn + 2 end
  end
  written[2] = usage_text(usage)
  if balance ~= read[1] then written[wn + 1], written[wn + 2], wn = 'balance', balance, wn + 2 end
  written[wn + 1], written[wn + 2], wn = 's', state_text_of({ held, next_expiry, tidy_at, most, gttl }), wn + 2
  for i = 1, READ_FIELDS.count do written[wn + i] = READ_FIELDS.written[i] end
  redis.call('HSET', KEYS[1], unpack(written, 1, wn + READ_FIELDS.count))
  redis.call('ZADD', KEYS[2], unpack(scores, 1, sn))
  if not h then return { count, 0 } end
  if refused then return refusal(refused, states) end
  return reply({ 0, int(now), used, as_i64(usage[12]), grant }, states)
end
do
  local done = at_once()
  if done then return done end
end

ledger_begin(KEYS, now, num(ARGV[2]), num(ARGV[3]), num(ARGV[4]), ARGV[5])
local memory = num(ARGV[2])

-- Everything the call reads of the account's hash, in one HMGET.
local wanted, n = { 'balance', 'purchased', 's' }, 3
for i = 0, count - 1 do
  local a = first + i * 7
  local id = ARGV[a + 1]
  wanted[n + 1], wanted[n + 2], wanted[n + 3] = field('i:', id), field('l:', id), field('k:', ARGV[a])
  n = n + 3
  if ARGV[a + 4] ~= '' then
    n = n + 1
    wanted[n] = field('o:', ARGV[a])
  end
end
for i = 0, renewals - 1 do
  n = n + 1
  wanted[n] = field('i:', ARGV[r + 3 + i * 2])
end
if h then
  local key = ARGV[h + 1]
  wanted[n + 1], wanted[n + 2], wanted[n + 3], wanted[n + 4] = field('i:', ARGV[h + 2]), field('k:', key), field('t:', key), field('r:', key)
  n = n + 4
end
if admission then gcra_fields(wanted, n) end
load(wanted)
sweep()

-- Records a request's real cost and releases its hold, once per id: its
-- marker (kept `memory` µs, longer than any retry of it can come) is
-- written in the same step as its cost, and a settlement that finds it
-- records nothing. One that finds neither its hold nor its marker (a hold
-- Redis lost with its data) still records its cost: lost data costs a
-- late charge, never a free request. One that finds its lapsed hold
-- replaces the lapse's charge. The cost counts in the periods its hold was
-- admitted in (else those of the lapse it replaces, else the current
-- ones). Returns 1 when recorded, 0 when the id was settled already.
local function settle(key, id, cost, byok)
  local request = field('i:', id)
  local value = get(request)
  local charge_starts
  if holds(value) then
    local amount, covered, _, _, its_key, admitted = hold_parts(value)
    if admitted then charge_starts = starts_at(num(admitted)) end
    release(amount, covered, its_key)
  elseif known(value, 'S') then
    return 0
  elseif known(value, 'L') then
    charge_starts = undo_lapse(id, value)
  end
  -- A lapse its id was admitted again over (see hold) is undone too.
  local earlier = get(field('l:', id))
  if known(earlier, 'L') then
    local earlier_starts = undo_lapse(id, earlier)
    charge_starts = charge_starts or earlier_starts
    forget_field(field('l:', id))
  end
  add_usage(key, cost, byok, charge_starts)
  if not byok and cost ~= '0' then put('balance', signed_add(get('balance'), cost, true)) end
  put(request, 'S:' .. int(now + memory))
  track(id, -(now + memory))
  return 1
end

local recorded = 0
for i = 0, count - 1 do
  local a = first + i * 7
  local new = settle(ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3] == '1')
  -- A record goes with the first settlement of its id only, as its cost does.
  if new == 1 and ARGV[a + 4] ~= '' then
    keep_generation(ARGV[a + 1], ARGV[a + 4], num(ARGV[a + 5]), ARGV[a + 6], ARGV[a])
  end
  recorded = recorded + new
end

-- Each live hold renewed lasts `lifetime` from now (never shortened); a
-- lapsed one whose request goes on (its instance lost the store for
-- longer than the hold) keeps its charge known for its settlement. Only
-- the key that holds it renews it.
local renewed = 0
if renewals > 0 then
  local expires_at = int(now + num(ARGV[r + 1]))
  local later = {}
  for i = 0, renewals - 1 do
    local id = ARGV[r + 3 + i * 2]
    local value = get(field('i:', id))
    -- Renewed only by the key that holds it.
    if holds(value) and select(5, hold_parts(value)) == ARGV[r + 2 + i * 2] then
      later[2 * renewed + 1], later[2 * renewed + 2] = expires_at, id
      renewed = renewed + 1
    elseif known(value, 'L') and string.match(value, '^L:%d+:%d+:%d:%d+:%d+:%d+:(.*)$') == ARGV[r + 2 + i * 2] then
      local forget_at = now + C.lapse
      put(field('i:', id), 'L:' .. int(forget_at) .. string.match(value, '^L:%d+(:.*)$'))
      track(id, -forget_at)
    end
  end
  C.renewed = later
end

if not admission then
  ledger_end(count > 0)
  return { recorded, renewed }
end

-- Decides the hold whose arguments start after ARGV[h] for `key` (its own
-- terms once set, else the request's; see grant_of).
local function hold(key)
  local id = ARGV[h + 2]
  local expires_at = now + num(ARGV[h + 5])
  local has_limit, limit_text, reset, include_byok = limit_terms(terms(key))
  local p = PERIOD_INDEX[reset]
  local own, byok = usage_in(key, p)
  local used = own
  if include_byok then used = add(own, byok) end
  local request = field('i:', id)
  local previous = get(request)
  -- Its settlement came first (the caller gave up on it): the request was
  -- never sent, and nothing must stay held.
  if known(previous, 'S') then return { 0, used, as_i64(text(kget(key, 'h'))), '0' } end
  -- The same id held already (an admission is sent once, so never
  -- expected): the new hold replaces it, if granted; its amount is not
  -- among the holds the new one adds to.
  local replaced, replaced_covered, replaced_key = '0', false, nil
  local holding = holds(previous)
  if holding then
    local amount_text, covered_before, _, _, its_key = hold_parts(previous)
    replaced, replaced_covered, replaced_key = amount_text, covered_before, its_key
  end
  local reserved = text(kget(key, 'h'))
  if replaced_key == key then reserved = less(reserved, replaced) end
  local covered = ARGV[h + 11] == '1'
  local account_held
  if covered then
    account_held = text(sget('held'))
    if replaced_covered then account_held = less(account_held, replaced) end
  end
  local refused, grant = grant_of(used, reserved, has_limit, limit_text, reset, get('balance') or '0', account_held)
  if refused then return refused end
  -- Granted: the hold it replaces is released, on its own key.
  if holding then release(replaced, replaced_covered, replaced_key) end
  local total = add_held(kget(key, 'h'), grant)
  -- A lapsed id admitted again: its lapse's charge stays known beside the
  -- new hold, for its settlement to undo.
  if known(previous, 'L') then put(field('l:', id), previous) end
  put(request, hold_value(grant, key))
  kput(key, 'h', total)
  if covered then sput('held', add_held(sget('held'), grant)) end
  track(id, expires_at)
  local next_expiry = sget('next')
  if not next_expiry or num(next_expiry) > expires_at then sput('next', int(expires_at)) end
  return { 0, used, as_i64(total), grant }
end

local fit, states = counters_check(now, checks, 4, c, tier_capacities(get('purchased')), LEDGER_FIELDS)
local key = h and ARGV[h + 1]
-- A revoked key is refused first, whatever its counters say; then one past
-- its expiry by this clock.
if key and get(field('r:', key)) then
  ledger_end(true)
  return refusal({ 5 }, states)
end
local expiry = key and select(4, terms(key))
if expiry and expiry ~= '' and num(expiry) <= now then
  ledger_end(true)
  return refusal({ 6, expiry }, states)
end
if not fit then
  ledger_end(true)
  return refusal({ 4 }, states)
end
local decided = { 0, '0', '0', '0' }
if key then
  decided = hold(key)
  if decided[1] ~= 0 then
    ledger_end(true)
    return refusal(decided, states)
  end
end
counters_commit(now, C.slack_ms, states, LEDGER_FIELDS)
ledger_end(true)
return reply({ 0, int(now), decided[2], decided[3], decided[4] }, states)
