-- Prepended to every script. `int(x)`: the integer `x` as decimal text.
-- Lua's own number formatting would turn large integers into exponent
-- notation; '%d' is exact for any integer a double holds below 2^63 and,
-- unlike '%.0f' (glibc's multi-precision path for doubles this large),
-- cheap: a ledger call formats a few dozen. Anything else (a fraction,
-- inf, nan) keeps '%.0f'.
local function int(x)
  if x == math.floor(x) and x > -9.2e18 and x < 9.2e18 then return string.format('%d', x) end
  return string.format('%.0f', x)
end
