-- Prepended to every script: integers between decimal text and Lua
-- numbers. Both directions go through libc (strtod, printf) and each
-- costs about 2,000 instructions, dearer than most of a call's logic; a
-- call mostly reads texts that an earlier call wrote, and formats the
-- same instant more than once. So each text made or read here is
-- remembered with its number, both ways, until 1,024 are (then all are
-- forgotten at once: a table's lookup costs 2 % of a conversion). Not
-- more: Lua's collector walks what is remembered on every cycle, and on
-- bench/redis_replay.sh's load 4,096 cost 2.5 % more instructions per
-- call than 1,024 (16,384 another 9 %), 256 about 1 % more.
local NUMBERS, TEXTS, REMEMBERED = {}, {}, 0
-- Counts one more remembered, forgetting all first when they are many.
local function make_room()
  if REMEMBERED >= 1024 then NUMBERS, TEXTS, REMEMBERED = {}, {}, 0 end
  REMEMBERED = REMEMBERED + 1
end
-- `int(x)`: the integer `x` as decimal text. Lua's own number formatting
-- would turn large integers into exponent notation; '%d' is exact for any
-- integer a double holds below 2^63 and, unlike '%.0f' (glibc's
-- multi-precision path for doubles this large), cheap. Anything else (a
-- fraction, inf, nan) keeps '%.0f'.
local function int(x)
  local text = TEXTS[x]
  if text then return text end
  if x % 1 == 0 and x > -9.2e18 and x < 9.2e18 then
    text = string.format('%d', x)
    make_room()
    NUMBERS[text], TEXTS[x] = x, text
    return text
  end
  return string.format('%.0f', x)
end
-- `num(s)`: `tonumber(s)`, remembered for texts (one way only: `int`
-- must give '%d' text back, whatever text a number was read from).
local function num(s)
  local n = NUMBERS[s]
  if n then return n end
  n = tonumber(s)
  if n and type(s) == 'string' then
    make_room()
    NUMBERS[s] = n
  end
  return n
end
