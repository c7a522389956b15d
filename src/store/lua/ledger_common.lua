-- Shared by the ledger functions: the ledger's layout 4.
--
-- An account's whole ledger is one hash (A) and one sorted set (X), plus
-- its generation records (a hash of id -> record and a sorted set of id ->
-- expiry µs). A holds, as fields (several values packed in one field,
-- separated by ':', so that a call moves few values between Lua and Redis):
--   balance, purchased  nano-credits, decimal (the balance may be negative)
--   s                   'held:next:tidy:gmax:gttl': the sum of the live
--                       holds its balance covers; µs no live hold expires
--                       before ('' none); µs when forgotten ids and records
--                       are next removed; the most generation records kept
--                       (the last asked); µs until which the record keys
--                       are known to live
--   k:<key>             the key's usage and holds: 't:bt:ds:d:bd:ws:w:bw:ms:m:bm:h'
--                       (all time own and BYOK; per period, day, week and
--                       month, its start, own and BYOK usage; its live holds)
--   t:<key>             its terms 'tl:tr:tb:tx': limit ('-' none), reset
--                       (n/d/w/m), BYOK counted (0/1), expiry (µs, '' never)
--   r:<key>             revoked at (µs), absent while it works
--   o:<key>             µs until which the key's own order of its records
--                       is known to live (absent: unknown)
--   <counter key>       a GCRA rate limit's next arrival (µs), the field
--                       named by the counter's own key (see counters.lua)
--   i:<id>              a request the ledger tracks:
--     'A:<admitted at>:<amount>:<c|b>:<retention>:<most>:<key>' while it
--       holds (c: the balance covers it too; retention and most, when not
--       empty, say how its lapse's generation record is kept; its cost
--       counts in the periods containing the µs it was admitted at), or
--       'B:<admitted at>:<amount>:<c|b>:<retention>:<most>:<n>:<model><key>'
--       when its lapse's record names a model (of n bytes), or
--       'H:<amount>:<c|b>:<retention>:<most>:<key>' for a hold an older
--       version wrote (its cost counts in the periods it ends in);
--     'S:<forget at>' once settled (its marker);
--     'L:<forget at>:<amount>:<byok 0/1>:<ds>:<ws>:<ms>:<key>' once its
--       hold lapsed, charged that amount in those periods.
--   l:<id>              the lapse of an id admitted again (its 'L' value),
--                       for the new hold's settlement to undo as well
-- X orders the tracked ids in time: a live hold by its expiry (a positive
-- score), a settled or lapsed id by minus the µs it is forgotten at. A
-- settled or lapsed id whose time is up counts as gone before it is
-- removed (in bulk, at most ten times a second), so removing it late changes
-- no answer. An admission and the settlements it carries read A with one
-- HMGET and write it with one HSET.

-- Exact non-negative integers as {high, low} in base 10^9: a Lua number is
-- a double, exact only up to 2^53 nano-credits (9 million credits), and a
-- balance or a key's all-time usage may grow beyond that.
local BASE = 1000000000
local function big(s)
  if not s or s == '' then return { 0, 0 } end
  local n = #s
  if n <= 9 then return { 0, num(s) } end
  return { num(string.sub(s, 1, n - 9)), num(string.sub(s, n - 8)) }
end
local function big_add(a, b)
  local high, low = a[1] + b[1], a[2] + b[2]
  if low >= BASE then high, low = high + 1, low - BASE end
  return { high, low }
end
local function big_ge(a, b) return a[1] > b[1] or (a[1] == b[1] and a[2] >= b[2]) end
local function big_sub(a, b) -- a >= b
  local high, low = a[1] - b[1], a[2] - b[2]
  if low < 0 then high, low = high - 1, low + BASE end
  return { high, low }
end
-- a - b, or zero when b is larger (a kept sum never goes below nothing).
local function big_less(a, b)
  if big_ge(a, b) then return big_sub(a, b) end
  return { 0, 0 }
end
-- The bounds of i64, as two-part integers.
local I64_MAX = { 9223372036, 854775807 }
local I64_MIN_MAGNITUDE = { 9223372036, 854775808 }
local function big_str(a)
  if a[1] == 0 then return int(a[2]) end
  return int(a[1]) .. string.format('%09d', a[2])
end
-- Decimal texts (nano-credits, no sign unless said) added, subtracted and
-- compared exactly: as Lua numbers while the operands and the result are
-- below 2^53 (EXACT; a text of at most 16 digits reads as its number
-- there, and one past it reads as EXACT or more), else as two-part
-- integers. Absent ('' or false) counts as 0.
local EXACT = 9007199254740992
local function text(a) if not a or a == '' then return '0' end return a end
-- These helpers run dozens of times a call, and a Lua call costs about
-- as much as three table reads here: `text`, `num` and `int` are written
-- out in them (their remembered values read first).
-- A sum, exact whatever its size: what holds add up to (the in-process
-- store keeps that in 128 bits).
local function add_held(a, b)
  if not a or a == '' then a = '0' end
  -- Most sums add nothing to one side (texts are canonical decimals).
  if not b or b == '' or b == '0' then return a end
  if a == '0' then return b end
  if #a <= 16 and #b <= 16 then
    -- Both below EXACT and so is their sum, or the sum is EXACT or more.
    local sum = (NUMBERS[a] or num(a)) + (NUMBERS[b] or num(b))
    if sum < EXACT then return TEXTS[sum] or int(sum) end
  end
  return big_str(big_add(big(a), big(b)))
end
-- `value` as an i64: the largest i64 when it is larger.
local function as_i64(value)
  if #value >= 19 and big_ge(big(value), I64_MAX) then return '9223372036854775807' end
  return value
end
-- A sum of usage: as the in-process store does, it stops at the largest
-- i64.
local function add(a, b)
  local sum = add_held(a, b)
  if #sum >= 19 then return as_i64(sum) end
  return sum
end
-- a - b, or 0 when b is larger (a kept sum never goes below nothing).
local function less(a, b)
  if not a or a == '' then a = '0' end
  if not b or b == '' or b == '0' then return a end
  if a == b then return '0' end
  if #a <= 16 and #b <= 16 then
    local x, y = NUMBERS[a] or num(a), NUMBERS[b] or num(b)
    if x < EXACT and y < EXACT then
      local d = x - y
      if d < 0 then return '0' end
      return TEXTS[d] or int(d)
    end
  end
  return big_str(big_less(big(a), big(b)))
end
local function ge(a, b)
  if not a or a == '' then a = '0' end
  if not b or b == '' then b = '0' end
  if #a <= 16 and #b <= 16 then
    local x, y = NUMBERS[a] or num(a), NUMBERS[b] or num(b)
    if x < EXACT and y < EXACT then return x >= y end
  end
  return big_ge(big(a), big(b))
end
local function minimum(a, b) if ge(a, b) then return b end return a end

-- A signed decimal (the balance) plus or, when `subtract`, minus the
-- decimal text `b`.
local function signed_add(value, b, subtract)
  value = text(value)
  if #value <= 17 and #b <= 16 then
    local n, m = num(value), num(b)
    if n < EXACT and n > -EXACT and m < EXACT then
      if subtract then n = n - m else n = n + m end
      if n < EXACT and n > -EXACT then return int(n) end
    end
  end
  local negative, magnitude = false, nil
  if string.sub(value, 1, 1) == '-' then negative, magnitude = true, big(string.sub(value, 2)) else magnitude = big(value) end
  local amount = big(b)
  local result, result_negative
  if negative == subtract then
    result, result_negative = big_add(magnitude, amount), negative
  elseif big_ge(magnitude, amount) then
    result, result_negative = big_sub(magnitude, amount), negative
  else
    result, result_negative = big_sub(amount, magnitude), subtract
  end
  -- As the in-process store does, a balance stays within i64.
  if result_negative and big_ge(result, I64_MIN_MAGNITUDE) then return '-9223372036854775808' end
  if not result_negative and big_ge(result, I64_MAX) then return '9223372036854775807' end
  local out = big_str(result)
  if result_negative and out ~= '0' then return '-' .. out end
  return out
end

-- Nano-credits (decimal text) as decimal credits: '0.4', '12'.
local function credits_text(nanos)
  local n = #nanos
  if n <= 9 then nanos = string.rep('0', 10 - n) .. nanos; n = 10 end
  local whole, fraction = string.sub(nanos, 1, n - 9), string.gsub(string.sub(nanos, n - 8), '0+$', '')
  if fraction == '' then return whole end
  return whole .. '.' .. fraction
end

-- RFC 3339 (to the second) of `micros`.
local function rfc3339(micros)
  local seconds = fdiv(micros, 1000000)
  local day = fdiv(seconds, 86400)
  local y, m = civil_from_days(day)
  local d = day - days_from_civil(y, m) + 1
  local s = seconds - day * 86400
  return string.format('%04d-%02d-%02dT%02d:%02d:%02dZ', y, m, d, fdiv(s, 3600), fdiv(s % 3600, 60), s % 60)
end

-- How often (µs) forgotten ids and records past their time or the cap are
-- removed: each removal is a few commands, so at most ten times a second;
-- often enough that a busy account's removals stay small (at 10,000
-- requests a second, about 1,000 records past the cap each time).
local TIDY_US = 100000
-- The most ids (and records) one tidying removes of each kind, so that no
-- call stalls the server (removing 1,000 at once took about 0.9 ms); one
-- that leaves more behind lets the account tidy again TIDY_BEHIND_US
-- later: up to 20,000 of each a second, in small steps.
local TIDY_MOST = 200
local TIDY_BEHIND_US = 10000
-- What is forgotten (ids, records past their time) stays a minute more
-- before it is removed, unseen: a clock that steps back less than that
-- finds what it would have found before (as the in-process store does).
local FORGOTTEN_KEPT_US = 60000000

-- A table that stays empty: what a call has nothing to put in.
local EMPTY = {}

-- Field names ('i:' .. id, 'k:' .. key, ...) of the account's hash
-- remembered, as numbers are (int.lua, and as many): a call names each of
-- its fields several times, and the next one names the same key and
-- settles the ids this one admitted. A record's fields are named once,
-- without it.
local FIELD_NAMES, FIELD_NAMES_COUNT = {}, 0
local function field(prefix, x)
  local names = FIELD_NAMES[prefix]
  local name = names and names[x]
  if name then return name end
  if FIELD_NAMES_COUNT >= 1024 then FIELD_NAMES, FIELD_NAMES_COUNT = {}, 0 end
  names = FIELD_NAMES[prefix]
  if not names then
    names = {}
    FIELD_NAMES[prefix] = names
  end
  name = prefix .. x
  names[x], FIELD_NAMES_COUNT = name, FIELD_NAMES_COUNT + 1
  return name
end

-- The call's state, set afresh by ledger_begin: the account's keys and
-- name, the instant it decides at, how long markers and lapses are kept,
-- the fields of A read (false when absent) and changed, the X scores and
-- records (by id: record, expiry, retention and key) to write, and the
-- records removed (by id: their key). What a call may add later (the
-- periods' starts, the account's state, the renewed holds) is named here
-- as false, so that the table is sized once.
local C = {}

local function ledger_begin(keys, now, memory_us, lapse_us, slack_ms, account)
  C = { A = keys[1], X = keys[2], gen = keys[3], genexp = keys[4], now = now, memory = memory_us,
    lapse = lapse_us, slack_ms = slack_ms, name = account, F = {}, dirty = {}, scores = {},
    records = {}, K = {}, gone = {}, deleted = {}, unrecorded = {}, starts = false, S = false, renewed = false }
end

-- Runs `command` on `key` with `values`, after `flag` and `other_flag`
-- when given, 1,000 values at a time (unpack() fails past a few thousand;
-- pairs stay whole).
local function sliced(command, key, values, flag, other_flag)
  for i = 1, #values, 1000 do
    local last = math.min(i + 999, #values)
    if flag then
      redis.call(command, key, flag, other_flag, unpack(values, i, last))
    else
      redis.call(command, key, unpack(values, i, last))
    end
  end
end

-- Reads the fields of `names` not read yet, with one HMGET.
local function load(names)
  -- `names` is the caller's to give: what is loaded already is taken out
  -- of it, in place (a new table would grow by rehashing).
  local F, wanted = C.F, names
  local n, count = 0, #names
  for i = 1, count do
    local name = names[i]
    if F[name] == nil then n = n + 1; wanted[n] = name; F[name] = false end
  end
  for i = n + 1, count do wanted[i] = nil end
  -- In slices: unpack() fails past a few thousand values.
  for i = 1, #wanted, 1000 do
    local last = math.min(i + 999, #wanted)
    local values = redis.call('HMGET', C.A, unpack(wanted, i, last))
    for j = i, last do F[wanted[j]] = values[j - i + 1] or false end
  end
end
local function get(name)
  local value = C.F[name]
  if value == nil then
    load({ name })
    value = C.F[name]
  end
  return value
end
local function put(name, value) C.F[name] = value; C.dirty[name] = true end
-- The hash's fields as counters.lua reads and writes a GCRA counter's
-- state in a ledger call.
local LEDGER_FIELDS = { get = get, put = put }
-- The same for a call that read the fields itself (ledger_write.lua's
-- at_once): `names` and `values` as read (the counters' fields from the
-- `first`), and the counters' writes (`written`, `count` values). The
-- library's own, so that a call makes no closures.
local READ_FIELDS = { names = EMPTY, values = EMPTY, first = 1, written = {}, count = 0 }
function READ_FIELDS.get(name)
  local names = READ_FIELDS.names
  for i = READ_FIELDS.first, #names do
    if names[i] == name then return READ_FIELDS.values[i] end
  end
  return false
end
function READ_FIELDS.put(name, value)
  local n = READ_FIELDS.count
  READ_FIELDS.written[n + 1], READ_FIELDS.written[n + 2] = name, value
  READ_FIELDS.count = n + 2
end
-- Removes field `name` when the call ends (unless written again).
local function forget_field(name)
  C.F[name] = false
  C.dirty[name] = nil
  C.deleted[name] = true
end
-- Gives `id` score `score` in X when the call ends.
local function track(id, score)
  local scores = C.scores
  local n = #scores
  scores[n + 1], scores[n + 2] = int(score), id
end

-- The parts of a key's packed usage (`k:<key>`) and of the account's
-- state (`s`), by name.
local KEY_SLOTS = { t = 1, bt = 2, ds = 3, d = 4, bd = 5, ws = 6, w = 7, bw = 8, ms = 9, m = 10, bm = 11, h = 12 }
local KEY_PATTERN = '^([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*):([^:]*)$'
local STATE_SLOTS = { held = 1, next = 2, tidy = 3, gmax = 4, gttl = 5 }
local STATE_PATTERN = '^([^:]*):([^:]*):([^:]*):([^:]*):([^:]*)$'

-- The parts of the packed values this library wrote or read lately, by
-- value: a call most often reads what the call before it wrote, and
-- splitting a value is dear in Lua.
local UNPACKED, UNPACKED_COUNT = {}, 0
local function unpacked(packed, pattern, count)
  local parts = UNPACKED[packed]
  if not parts then
    parts = { string.match(packed, pattern) }
    for i = 1, count do
      if parts[i] == '' then parts[i] = false end
    end
    if UNPACKED_COUNT >= 256 then UNPACKED, UNPACKED_COUNT = {}, 0 end
    UNPACKED[packed], UNPACKED_COUNT = parts, UNPACKED_COUNT + 1
  end
  return parts
end
-- `parts` (false where empty) is kept as it is: the caller changes them no
-- more.
local function remember_packed(packed, parts)
  if UNPACKED[packed] then return end
  if UNPACKED_COUNT >= 256 then UNPACKED, UNPACKED_COUNT = {}, 0 end
  UNPACKED[packed], UNPACKED_COUNT = parts, UNPACKED_COUNT + 1
end

local NO_USAGE = { false, false, false, false, false, false, false, false, false, false, false, false }
-- A key's usage, unpacked once per call (absent parts are false).
local function key_state(key)
  local k = C.K[key]
  if k then return k end
  local packed = get(field('k:', key))
  local p = packed and unpacked(packed, KEY_PATTERN, 12) or NO_USAGE
  k = { p[1] or false, p[2] or false, p[3] or false, p[4] or false, p[5] or false, p[6] or false, p[7] or false,
    p[8] or false, p[9] or false, p[10] or false, p[11] or false, p[12] or false, dirty = false }
  C.K[key] = k
  return k
end
local function kget(key, name) return (C.K[key] or key_state(key))[KEY_SLOTS[name]] end
local function kput(key, name, value)
  local k = key_state(key)
  k[KEY_SLOTS[name]] = value
  k.dirty = true
end
-- The account's state, unpacked once per call.
local function state()
  if not C.S then
    local s = { false, false, false, false, false }
    local packed = get('s')
    if packed then
      local parts = unpacked(packed, STATE_PATTERN, 5)
      for i = 1, 5 do s[i] = parts[i] or false end
    end
    C.S = s
  end
  return C.S
end
local function sget(name) return (C.S or state())[STATE_SLOTS[name]] end
local function sput(name, value)
  state()[STATE_SLOTS[name]] = value
  C.S.dirty = true
end
-- A key's terms as stored in `packed` (its `t:` field, or nothing): its
-- limit text (nil when none is stored), reset, BYOK counted, expiry.
local function terms_of(packed)
  if not packed then return nil end
  return string.match(packed, '^([^:]*):([^:]*):([^:]*):([^:]*)$')
end
local function terms(key) return terms_of(get(field('t:', key))) end
-- State parts `s` (false where empty) packed into the account's field;
-- `s` is remembered as it is (the caller changes it no more).
local function state_text_of(s)
  local packed = (s[1] or '') .. ':' .. (s[2] or '') .. ':' .. (s[3] or '') .. ':' .. (s[4] or '') .. ':' .. (s[5] or '')
  remember_packed(packed, s)
  return packed
end
local function state_text()
  local s = state()
  return state_text_of({ s[1], s[2], s[3], s[4], s[5] })
end
-- Usage parts `k` (false where empty) packed into a key's field.
local function usage_text(k)
  local packed = (k[1] or '') .. ':' .. (k[2] or '') .. ':' .. (k[3] or '') .. ':' .. (k[4] or '') .. ':'
    .. (k[5] or '') .. ':' .. (k[6] or '') .. ':' .. (k[7] or '') .. ':' .. (k[8] or '') .. ':'
    .. (k[9] or '') .. ':' .. (k[10] or '') .. ':' .. (k[11] or '') .. ':' .. (k[12] or '')
  remember_packed(packed, k)
  return packed
end

-- Packs what the call changed of the keys' usage and the account's state
-- into their fields.
local function pack()
  for key, k in pairs(C.K) do
    if k.dirty then put(field('k:', key), usage_text(k)) end
  end
  local s = C.S
  if s and s.dirty then put('s', state_text()) end
end

-- The periods' starts (day, week, month) at `now` as decimal text, worked
-- out once a day: the library's own state outlives a call.
local STARTS_DAY, STARTS
local function starts_on(now)
  local day = fdiv(now, DAY_US)
  if day ~= STARTS_DAY then STARTS_DAY, STARTS = day, period_starts(now) end
  return STARTS
end
-- The current ones.
local function starts()
  if not C.starts then C.starts = starts_on(C.now) end
  return C.starts
end

-- Own and BYOK usage (strings) of `key` in period `p` (0 all time, 1 day,
-- 2 week, 3 month): a period's sums count only while its stored start is
-- the current one.
local PERIOD = { 'd', 'w', 'm' }
-- A key limit's reset ('n' never) as a period of usage_in.
local PERIOD_INDEX = { n = 0, d = 1, w = 2, m = 3 }
local PERIOD_START = { 'ds', 'ws', 'ms' }
local PERIOD_BYOK = { 'bd', 'bw', 'bm' }
-- The same of usage parts `k` (KEY_SLOTS: period p's start, own and BYOK
-- sums are parts 3p, 3p + 1 and 3p + 2), the current periods starting at
-- `current`.
local function period_usage(k, p, current)
  if p == 0 then return k[1] or '0', k[2] or '0' end
  if k[3 * p] ~= current[p] then return '0', '0' end
  return k[3 * p + 1] or '0', k[3 * p + 2] or '0'
end
local function usage_in(key, p)
  local k = C.K[key] or key_state(key)
  if p == 0 then return period_usage(k, 0) end
  return period_usage(k, p, starts())
end

-- Adds `cost` (decimal text) to the usage parts `k` (as KEY_SLOTS) in the
-- periods starting at `in_starts` (those its hold was admitted in, or the
-- current ones), own or BYOK, and all time. Periods only roll forward: a
-- cost stamped in a period that has already rolled over (a hold admitted
-- before the period turned, a caller's clock a moment behind) counts in
-- the all-time sums only.
local function add_usage_to(k, cost, byok, in_starts)
  -- In the packed usage, period p's start, own and BYOK sums are parts
  -- 3p, 3p + 1 and 3p + 2.
  for p = 1, 3 do
    local at = 3 * p
    local start, current = in_starts[p], k[at]
    if not current or (current ~= start and num(start) > num(current)) then
      k[at], k[at + 1], k[at + 2] = start, '0', '0'
      current = start
    end
    if current == start then
      local slot = byok and at + 2 or at + 1
      k[slot] = add(k[slot], cost)
    end
  end
  local total = byok and 2 or 1
  k[total] = add(k[total], cost)
end
-- The same to `key`'s usage, in the current periods when `in_starts` is nil.
local function add_usage(key, cost, byok, in_starts)
  local k = key_state(key)
  add_usage_to(k, cost, byok, in_starts or starts())
  k.dirty = true
end

-- Whether `value` is a live hold's ('A', 'B', or 'H' as an older version wrote).
local function holds(value)
  if not value or string.byte(value, 2) ~= 58 then return false end
  local kind = string.byte(value, 1)
  return kind == 65 or kind == 66 or kind == 72
end
-- The parts of the holds this library wrote lately, by value: most holds
-- are settled by a call soon after the one that admitted them, and
-- matching a value's pattern costs as much as 3 conversions (int.lua).
local HOLD_PARTS, HOLD_PARTS_COUNT = {}, 0
local function remember_hold(value, parts)
  if HOLD_PARTS_COUNT >= 1024 then HOLD_PARTS, HOLD_PARTS_COUNT = {}, 0 end
  HOLD_PARTS[value], HOLD_PARTS_COUNT = parts, HOLD_PARTS_COUNT + 1
end
-- The parts of a hold's value: amount, covered (bool), retention, most
-- (text, '' when its lapse keeps no record), key, the µs it was
-- admitted at (nil for an 'H' hold), and the model its lapse record names
-- (a 'B' hold's).
local function hold_parts(value)
  local parts = HOLD_PARTS[value]
  if parts then return parts[1], parts[2], parts[3], parts[4], parts[5], parts[6], parts[7] end
  if string.byte(value, 1) == 66 then
    local _, _, admitted, amount, flag, retention, most, length, rest =
      string.find(value, '^B:(%d+):(%d+):([cb]):(%d*):(%d*):(%d+):(.*)$')
    length = num(length)
    return amount, flag == 'c', retention, most, string.sub(rest, length + 1), admitted,
      string.sub(rest, 1, length)
  end
  local _, _, admitted, amount, flag, retention, most, key =
    string.find(value, '^A:(%d+):(%d+):([cb]):(%d*):(%d*):(.*)$')
  if not admitted then
    _, _, amount, flag, retention, most, key = string.find(value, '^H:(%d+):([cb]):(%d*):(%d*):(.*)$')
  end
  return amount, flag == 'c', retention, most, key, admitted
end
-- The periods' starts of the instant `micros`: the current ones (worked
-- out once a day) when it is today, as most are.
local function starts_at(micros)
  if fdiv(micros, DAY_US) == fdiv(C.now, DAY_US) then return starts() end
  return period_starts(micros)
end
-- The starts of the periods a hold admitted at `admitted` (µs, text) is
-- charged in: those containing that instant, else (an 'H' hold, nil) the
-- current ones.
local function admitted_starts(admitted)
  if admitted then return starts_at(num(admitted)) end
  return starts()
end
-- A settled ('S') or lapsed ('L') value whose time is not up yet.
local BYTE = { S = 83, L = 76 }
local function known(value, kind)
  if not value or string.byte(value, 1) ~= BYTE[kind] then return false end
  local forget_at = string.match(value, '^.:(%d+)')
  return num(forget_at) > C.now
end

-- Takes a live hold (its amount, whether the balance covers it, its key:
-- see hold_parts) off its key's and the account's sums.
local function release(amount, covered, key)
  kput(key, 'h', less(kget(key, 'h'), amount))
  if covered then sput('held', less(sget('held'), amount)) end
end

-- Keeps generation record `record` of `id`, made with `key`, for
-- `retention` µs among the account's newest `most` (removed past either
-- when the account is next tidied; readers never see them meanwhile).
local function keep_generation(id, record, retention, most, key)
  C.records[id] = { record, int(C.now + retention), retention, key }
  if sget('gmax') ~= most then sput('gmax', most) end
end

-- The generation record a lapse leaves (as `lapse_record` in ledger.rs);
-- its model, printable ASCII without quotes or backslashes (the store
-- checks), is written as it is.
local function lapse_record(key, id, amount, byok, model)
  local cost = credits_text(amount)
  return '{"id":' .. cjson.encode('gen-' .. id) .. ',"total_cost":' .. cost .. ',"usage":' .. cost
    .. ',"cost_basis":"lapsed","is_byok":' .. (byok and 'true' or 'false') .. ',"lapsed":true,"created_at":"'
    .. rfc3339(C.now) .. '","user_id":' .. cjson.encode(C.name) .. ',"key_hash":' .. cjson.encode(key)
    .. (model and (',"model":"' .. model .. '"') or '') .. '}'
end

-- Charges the lapse of `id`'s live hold `value`: its key's usage (own when
-- the balance covers it, and then the balance too, else BYOK), kept as
-- 'L' for a late settlement to undo, with a record when the hold asked.
local function lapse(id, value)
  local amount, covered, retention, most, key, admitted, model = hold_parts(value)
  release(amount, covered, key)
  local byok = not covered
  local s = admitted_starts(admitted)
  if amount ~= '0' then add_usage(key, amount, byok, s) end
  if covered and amount ~= '0' then put('balance', signed_add(get('balance'), amount, true)) end
  if retention ~= '' then
    keep_generation(id, lapse_record(key, id, amount, byok, model), num(retention), most, key)
  end
  -- A lapse before it (the id admitted again over it) gives way to this
  -- one, as a second lapse of one id replaces the first.
  if get(field('l:', id)) then forget_field(field('l:', id)) end
  local forget_at = C.now + C.lapse
  put(field('i:', id), 'L:' .. int(forget_at) .. ':' .. amount .. ':' .. (byok and '1' or '0') .. ':' .. s[1] .. ':' .. s[2] .. ':' .. s[3] .. ':' .. key)
  return forget_at
end

-- The fields of requests `ids` in A: each one's state and the lapse it
-- was admitted again over. Named afresh, not remembered (`field`): most
-- are being forgotten, and would push out the names in use.
local function request_fields(ids)
  local fields = {}
  for i = 1, #ids do
    local id = ids[i]
    fields[2 * i - 1], fields[2 * i] = 'i:' .. id, 'l:' .. id
  end
  return fields
end

-- Lapses every live hold of the account expired by now (each ledger call
-- does first, as the in-process store does on every access, so both
-- agree on what is live). Costs nothing until the earliest expiry passes.
local function sweep()
  local next_expiry = sget('next')
  if not next_expiry or next_expiry == '' or num(next_expiry) > C.now then return end
  -- In pages, X unchanged until the call ends: every write waits for
  -- ledger_end, so a call that fails part way writes nothing. The live
  -- holds expired by now, ids only (a reply with scores formats each as
  -- a double, about 1 µs apiece); the offset walks past the expired ones
  -- of the pages before only.
  local offset, ids = 0, nil
  repeat
    ids = redis.call('ZRANGEBYSCORE', C.X, '(0', int(C.now), 'LIMIT', offset, 500)
    offset = offset + 500
    if #ids > 0 then
      local fields = request_fields(ids)
      load(fields)
      for _, id in ipairs(ids) do
        local value = get(field('i:', id))
        if holds(value) then
          track(id, -lapse(id, value))
        else
          C.gone[#C.gone + 1] = id
        end
      end
    end
  until #ids < 500
  -- The earliest hold past those that lapsed (still in X as it was).
  local first = redis.call('ZRANGEBYSCORE', C.X, '(' .. int(C.now), '+inf', 'LIMIT', 0, 1, 'WITHSCORES')
  sput('next', first[2] or false)
end

-- Gives back what the lapse `value` of `id` charged: to its key's usage
-- (all time, and each period still the one it was charged in) and, unless
-- BYOK, to the balance; and removes its record. Returns the starts of the
-- periods it was charged in.
local function undo_lapse(id, value)
  local _, _, amount, byok, ds, ws, ms, key = string.find(value, '^L:%d+:(%d+):(%d):(%d+):(%d+):(%d+):(.*)$')
  local charged_in = { ds, ws, ms }
  for p = 1, 3 do
    if kget(key, PERIOD_START[p]) == charged_in[p] then
      local name = byok == '1' and PERIOD_BYOK[p] or PERIOD[p]
      kput(key, name, less(kget(key, name), amount))
    end
  end
  local total = byok == '1' and 'bt' or 't'
  kput(key, total, less(kget(key, total), amount))
  if byok == '0' then put('balance', signed_add(get('balance'), amount, false)) end
  C.records[id] = nil
  C.unrecorded[id] = key
  return charged_in
end

-- Removes the settled and lapsed ids whose time is up, at most TIDY_MOST;
-- true when that many were found (more may be left).
local function forget_ids()
  local ids = redis.call('ZRANGEBYSCORE', C.X, int(-(C.now - FORGOTTEN_KEPT_US)), '(0', 'LIMIT', 0, TIDY_MOST)
  if #ids > 0 then
    local fields = request_fields(ids)
    redis.call('HDEL', C.A, unpack(fields))
    redis.call('ZREM', C.X, unpack(ids))
    -- The call's own writes of these ids are written back when it ends.
    for _, name in ipairs(fields) do
      if not C.dirty[name] then C.F[name] = nil end
    end
  end
  return #ids == TIDY_MOST
end

-- Takes records about to be removed out of their keys' orders (below),
-- and drops what names their keys. Those past the cap must go: a later
-- record kept for less time sorts below them, so left there they would
-- hide it from its key's page. A record's key is in field 'k:<id>' beside
-- it; records kept before that field existed name it in their JSON.
local function leave_key_orders(ids)
  local key_fields = {}
  for i = 1, #ids do key_fields[i] = 'k:' .. ids[i] end
  local keys = redis.call('HMGET', C.gen, unpack(key_fields))
  local by_key = {}
  for i = 1, #ids do
    local key = keys[i]
    if not key then
      local record = redis.call('HGET', C.gen, ids[i])
      key = record and string.match(record, '"key_hash":"([^"]*)"')
    end
    if key then
      local members = by_key[key]
      if not members then
        members = {}
        by_key[key] = members
      end
      members[#members + 1] = ids[i]
    end
  end
  -- An order emptied is dropped, TTL and all: its key's next record sets
  -- it again. Forgotten first: a call that fails part way (a Cluster
  -- slot half moved) keeps what it wrote, and an order it emptied must
  -- not stay known to live.
  local orders_known = {}
  for key in pairs(by_key) do orders_known[#orders_known + 1] = field('o:', key) end
  sliced('HDEL', C.A, orders_known)
  for key, members in pairs(by_key) do redis.call('ZREM', C.genexp .. ':' .. key, unpack(members)) end
  redis.call('HDEL', C.gen, unpack(key_fields))
end

-- Removes the records past their time or the account's cap, at most
-- TIDY_MOST of each; `more` says that the ids removed may have left some
-- behind: then the account is tidied again soon.
local function remove_old_records(more)
  local removed = false
  local expired = redis.call('ZRANGEBYSCORE', C.genexp, '-inf', int(C.now - FORGOTTEN_KEPT_US), 'LIMIT', 0, TIDY_MOST)
  if #expired > 0 then
    leave_key_orders(expired)
    redis.call('HDEL', C.gen, unpack(expired))
    redis.call('ZREM', C.genexp, unpack(expired))
    removed = true
    more = more or #expired == TIDY_MOST
  end
  local most = num(sget('gmax') or '')
  if most then
    local over = redis.call('ZCARD', C.genexp) - most
    if over > 0 then
      -- By rank, not ZPOPMIN: its reply carries each score formatted as a
      -- double (about 1 µs each), and only the ids are wanted.
      local last = math.min(over, TIDY_MOST) - 1
      local ids = redis.call('ZRANGE', C.genexp, 0, last)
      -- Out of the orders before the account's own: a call that fails
      -- part way leaves them to the next tidying.
      leave_key_orders(ids)
      redis.call('ZREMRANGEBYRANK', C.genexp, 0, last)
      redis.call('HDEL', C.gen, unpack(ids))
      removed = true
      more = more or over > TIDY_MOST
    end
  end
  -- They may have emptied the keys (Redis then drops them, TTL and all):
  -- the next records set it again.
  if removed then state()[5] = false end
  if more then state()[STATE_SLOTS.tidy] = int(C.now + TIDY_BEHIND_US) end
  if removed or more then redis.call('HSET', C.A, 's', state_text()) end
end

-- Makes keys `first` and `second` (optional) live at least `retention`
-- µs past `now` (and FORGOTTEN_KEPT_US and the slack past that), unless
-- `known` (µs, text or false: until when they are known to live) covers
-- it already. They are extended an eighth of the retention ahead (at most
-- an hour), so that the write comes once in that margin, and never
-- shortened (one may hold records kept longer). Returns the new known
-- instant, or nil when nothing was written.
local function keep_alive(now, retention, slack_ms, known, first, second)
  if num(known or '0') >= now + retention then return nil end
  local margin = math.min(math.ceil(retention / 8), 3600000000)
  local ttl_ms = math.ceil((retention + margin + FORGOTTEN_KEPT_US) / 1000) + slack_ms
  for _, name in ipairs({ first, second }) do
    if redis.call('PEXPIRE', name, ttl_ms, 'GT') == 0 then redis.call('PEXPIRE', name, ttl_ms, 'NX') end
  end
  return int(now + retention + margin)
end

-- Each key's own order of its records (`genexp:<key>`, in the account's
-- slot), for reading a key's page without walking the others': `records`
-- (as keep_records takes them) added, each order kept as long as its
-- newest record. Records leave it when they leave the account
-- (remove_old_records, undo_lapse), never by a cut of its own: the cap
-- may be raised before the account is tidied, and what it cut would then
-- be missing from the key's page. Until when each order is known to live
-- is its key's field 'o:<key>' (`known`, by key); those extended are set
-- in `extended`.
local function keep_key_orders(records, genexp, slack_ms, now, known, extended)
  -- By key: its records' expiries and ids, and the longest retention.
  local scored, longest = {}, {}
  for id, kept in pairs(records) do
    local key = kept[4]
    local members = scored[key]
    if not members then
      members = {}
      scored[key] = members
    end
    local n = #members
    members[n + 1], members[n + 2] = kept[2], id
    if not longest[key] or kept[3] > longest[key] then longest[key] = kept[3] end
  end
  for key, members in pairs(scored) do
    local order = genexp .. ':' .. key
    sliced('ZADD', order, members)
    extended[key] = keep_alive(now, longest[key], slack_ms, known[key], order)
  end
end

-- Writes generation records `records` (by id: the record, its expiry (µs,
-- text), retention (µs) and key) into the account's record keys `gen` and
-- `genexp` and their keys' orders (see keep_key_orders for `known` and
-- `extended`). The keys live as long as their longest-kept record, known
-- until `gttl` (µs, text or false), which is forgotten when records are
-- removed (see keep_alive). Returns the new `gttl`, or nil when it did not
-- move.
local function keep_records(records, gttl, now, slack_ms, gen, genexp, known, extended)
  local fields, expiries, retention, n = {}, {}, 0, 0
  for id, kept in pairs(records) do
    fields[2 * n + 1], fields[2 * n + 2], fields[2 * n + 3], fields[2 * n + 4] = id, kept[1], 'k:' .. id, kept[4]
    expiries[n + 1], expiries[n + 2] = kept[2], id
    n = n + 2
    if kept[3] > retention then retention = kept[3] end
  end
  sliced('HSET', gen, fields)
  sliced('ZADD', genexp, expiries)
  keep_key_orders(records, genexp, slack_ms, now, known, extended)
  return keep_alive(now, retention, slack_ms, gttl, gen, genexp)
end

-- Writes what the call changed: A's fields, X's scores, the records (whose
-- keys live as long as their longest-kept record, extended an eighth
-- ahead so that the write comes once in that margin).
local function ledger_end(admission)
  -- A read or a renewal of an account the ledger has never seen writes
  -- nothing (the in-process store keeps nothing for it either); one whose
  -- keys' terms alone are known starts its tidying now, as there.
  if not admission and not get('s') and not get('balance') and next(C.dirty) == nil
    and #C.scores == 0 and next(C.records) == nil and redis.call('EXISTS', C.A) == 0 then
    return
  end
  -- At most ten times a second (each removal is a few commands), or a
  -- hundred while the last one left some behind, the call tidies the account: ids
  -- forgotten, then, once its own records are kept, the records past
  -- their time or the cap.
  local tidying = num(sget('tidy') or '0') <= C.now
  local more_ids = false
  if tidying then
    sput('tidy', int(C.now + TIDY_US))
    more_ids = forget_ids()
  end
  -- Records removed may have emptied the keys (Redis then drops them,
  -- TTL and all): the records kept now set it again.
  -- So may the records undone have emptied their keys' orders.
  if next(C.unrecorded) ~= nil then
    sput('gttl', false)
    for _, key in pairs(C.unrecorded) do forget_field(field('o:', key)) end
  end
  if next(C.records) ~= nil then
    -- Until when their keys' orders are known to live, read at once (a
    -- lapse's record may be of a key the call has not read).
    local names, known, extended = {}, {}, {}
    for _, kept in pairs(C.records) do names[#names + 1] = field('o:', kept[4]) end
    load(names)
    for _, kept in pairs(C.records) do known[kept[4]] = get(field('o:', kept[4])) end
    local gttl = keep_records(C.records, sget('gttl'), C.now, C.slack_ms, C.gen, C.genexp, known, extended)
    if gttl then sput('gttl', gttl) end
    for key, until_us in pairs(extended) do put(field('o:', key), until_us) end
  end
  pack()
  local deleted = EMPTY
  if next(C.deleted) ~= nil then
    deleted = {}
    for name in pairs(C.deleted) do
      if not C.dirty[name] then deleted[#deleted + 1] = name end
    end
  end
  sliced('HDEL', C.A, deleted)
  local changed, F, n = {}, C.F, 0
  for name in pairs(C.dirty) do
    changed[n + 1], changed[n + 2] = name, F[name]
    n = n + 2
  end
  sliced('HSET', C.A, changed)
  sliced('ZREM', C.X, C.gone)
  sliced('ZADD', C.X, C.scores)
  -- Renewed holds: each lasts longer, never shorter.
  local renewed = C.renewed or EMPTY
  sliced('ZADD', C.X, renewed, 'XX', 'GT')
  local unrecorded, unrecorded_fields = EMPTY, EMPTY
  if next(C.unrecorded) ~= nil then unrecorded, unrecorded_fields = {}, {} end
  for id, key in pairs(C.unrecorded) do
    local kept = C.records[id]
    if not kept then
      unrecorded[#unrecorded + 1] = id
      unrecorded_fields[#unrecorded_fields + 1] = id
      unrecorded_fields[#unrecorded_fields + 1] = 'k:' .. id
    end
    -- Recorded again on another key (its settlement's), it leaves this
    -- key's order.
    if not kept or kept[4] ~= key then redis.call('ZREM', C.genexp .. ':' .. key, id) end
  end
  sliced('HDEL', C.gen, unrecorded_fields)
  sliced('ZREM', C.genexp, unrecorded)
  if tidying then remove_old_records(more_ids) end
end
