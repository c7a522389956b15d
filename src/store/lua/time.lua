-- Shared by the scripts that decide windows, periods and expiries
-- (prepended to each). `clock_now(arg)` is the instant a call decides at,
-- in µs: the caller's when it passed one, else Redis's own clock (TIME),
-- so that every gateway instance sharing this Redis agrees on windows and
-- periods whatever its own clock says.
local function clock_now(arg)
  -- Read with tonumber, not num: each instant comes once, and remembered
  -- it would only push out texts that come again.
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local DAY_US = 86400000000
local function fdiv(a, b) return math.floor(a / b) end

-- Proleptic Gregorian dates from and to days since 1970-01-01 (the
-- well-known era-based conversion; exact in doubles for any real date).
local function civil_from_days(z)
  z = z + 719468
  local era = fdiv(z, 146097)
  local doe = z - era * 146097
  local yoe = fdiv(doe - fdiv(doe, 1460) + fdiv(doe, 36524) - fdiv(doe, 146096), 365)
  local doy = doe - (365 * yoe + fdiv(yoe, 4) - fdiv(yoe, 100))
  local mp = fdiv(5 * doy + 2, 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end
local function days_from_civil(y, m)
  if m <= 2 then y = y - 1 end
  local era = fdiv(y, 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = fdiv(153 * mp + 2, 5)
  return era * 146097 + yoe * 365 + fdiv(yoe, 4) - fdiv(yoe, 100) + doy - 719468
end

-- Start and end (µs) of the UTC period 'd' (day), 'w' (week from Monday)
-- or 'm' (month) containing `now`.
local function period_bounds(p, now)
  local day = fdiv(now, DAY_US)
  if p == 'd' then return day * DAY_US, (day + 1) * DAY_US end
  if p == 'w' then
    -- 1970-01-01 was a Thursday, three days after a Monday.
    local monday = day - (day + 3) % 7
    return monday * DAY_US, (monday + 7) * DAY_US
  end
  local y, m = civil_from_days(day)
  local ny, nm = y, m + 1
  if nm == 13 then ny, nm = y + 1, 1 end
  return days_from_civil(y, m) * DAY_US, days_from_civil(ny, nm) * DAY_US
end

-- The starts of the day, week and month containing `now`, as decimal text
-- (as usage hashes store them).
local function period_starts(now)
  return { int((period_bounds('d', now))), int((period_bounds('w', now))), int((period_bounds('m', now))) }
end
