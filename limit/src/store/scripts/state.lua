-- state.lua: how a key's state is stored, the clock, the credit bound and calendar windows;
-- first in the library (src/store/redis/script.rs SOURCE), used by algorithms.lua and the modes.
--
-- Everything here is a local function built once, when Redis loads the library (`FUNCTION
-- LOAD`): a call builds no closure. Nothing at this level holds a call's data (a library's
-- upvalues outlive the call): every per-call table is made inside the mode's function.
--
-- fw, cw, sw, tb, gcra and lb keep one string per key: (s1, s2, s3) packed with
-- struct.pack('<Bd…', 1, numbers…): fw/cw window and count; sw window, curr and prev; tb level
-- and last; gcra/lb the TAT and the credit (a state without credit is one number). The decimal
-- form of earlier versions ("a:b", "a:b:c", "tat") is still read.

-- Library code runs with no library loaded (Redis loads `math`, `string`, `struct` and
-- `redis.call` for the functions' calls only): nothing at this level may name them.
local function floor(x) return x - x % 1 end

-- The script's `now` in µs: the injected time in `arg`, or Redis TIME when it is ''.
local function clock(arg)
  if arg ~= '' then return arg + 0 end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- Readers and writers of the three shapes (a GET's reply, false when the key is missing).
local function read2(v)
  if not v then return nil end
  if string.byte(v, 1) == 1 then
    local _, a, b = struct.unpack('<Bdd', v)
    return a, b
  end
  local a, b = string.match(v, '^(%-?%d+):(%-?%d+)$')
  return tonumber(a), tonumber(b)
end

local function read3(v)
  if not v then return nil end
  if string.byte(v, 1) == 1 then
    local _, a, b, c = struct.unpack('<Bddd', v)
    return a, b, c
  end
  local a, b, c = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+)$')
  return tonumber(a), tonumber(b), tonumber(c)
end

local function read_tat(v)
  if not v then return nil end
  if string.byte(v, 1) == 1 then
    if #v > 9 then
      local _, a, b = struct.unpack('<Bdd', v)
      return a, b
    end
    local _, a = struct.unpack('<Bd', v)
    return a
  end
  return tonumber(v)
end

local function pack2(a, b) return struct.pack('<Bdd', 1, a, b) end
local function pack3(a, b, c) return struct.pack('<Bddd', 1, a, b, c) end
local function pack_tat(a, b)
  if b and b > 0 then return struct.pack('<Bdd', 1, a, b) end
  return struct.pack('<Bd', 1, a)
end

-- Writes a string state to `key` with a TTL that ends at A.expiry (algorithms.lua). `kept`: the
-- expiry the key was read with (A.kept); when it is the new state's expiry too, `SET … KEEPTTL`
-- keeps it (no TTL to compute, format or set). `ttls` (optional): a call's table of TTL strings
-- by expiry, shared by its writes (many keys of a batch share an expiry: formatting a number is
-- a printf).
local function state_write(key, A, L, P, B, now, a, b, c, kept, ttls)
  local value = A.pack(a, b, c)
  local expires = A.expiry(L, P, B, a, b, c)
  if kept == expires then
    redis.call('SET', key, value, 'KEEPTTL')
    return
  end
  local ttl = ttls and ttls[expires]
  if not ttl then
    local ms = expires - now + 999
    ms = (ms - ms % 1000) / 1000
    if ms < 1 then ms = 1 end
    ttl = string.format('%d', ms)
    if ttls then ttls[expires] = ttl end
  end
  redis.call('SET', key, value, 'PX', ttl)
end

-- The most credit, in units, a subject can hold beyond a fresh limit (src/limiter/adjust.rs
-- credit_max): the quota, and less where (max(L, B) + credit) × P would reach 2^53 (× 1 for
-- fw/cw, whose numbers are counts), so every number stays exact in a double.
local function credit_max(alg, L, P, B)
  local exact = 9007199254740991
  local quota, top, q = L, L, exact
  if alg == 'tb' or alg == 'gcra' then quota = B elseif alg == 'lb' then quota = B + 1 end
  if alg ~= 'fw' and alg ~= 'cw' then
    if B > L then top = B end
    q = floor(exact / P)
    -- The double quotient may round up to the next integer.
    if q * P > exact then q = q - 1 end
  end
  local m = q - top
  if m > quota then m = quota end
  if m < 0 then m = 0 end
  return m
end

-- Calendar windows (src/calendar.rs, the same arithmetic): the UTC day, week (from Monday) or
-- month containing `now`, as [start, end) in µs. `code` is what the gateway sends as a cw
-- definition's P: 1 day, 2 week, 3 month. Computed here from the script's `now` (Redis `TIME`,
-- or the injected time), so a gateway whose clock is skewed cannot move a quota's window (one
-- clock per decision). Day numbers and µs stay below 2^53: Lua's doubles are exact.
local CAL_DAY = 86400000000

-- (year, month) of a day number since 1970-01-01 (Howard Hinnant's civil_from_days).
local function cal_civil(days)
  local z = days + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local m
  if mp < 10 then m = mp + 3 else m = mp - 9 end
  if m <= 2 then y = y + 1 end
  return y, m
end

-- The day number of the first of month `m` of year `y` (days_from_civil with d = 1).
local function cal_first(y, m)
  if m <= 2 then y = y - 1 end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local mp
  if m > 2 then mp = m - 3 else mp = m + 9 end
  local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + floor((153 * mp + 2) / 5)
  return era * 146097 + doe - 719468
end

-- `code` is the unit (1 day, 2 week, 3 month) plus 16 × a parameter (CalendarWindow's
-- script_code): 0 for the plain units; a month's billing day (2–28: windows from that day of
-- one month to the same day of the next); a day's or week's offset from UTC in minutes plus
-- 2048 (windows from local midnight).
local function cal_window(code, now)
  local unit = code % 16
  local param = floor(code / 16)
  if unit == 3 and param > 1 then
    local day = floor(now / CAL_DAY)
    local y, m = cal_civil(day)
    local d = day - cal_first(y, m) + 1
    local fy, fm, ty, tm
    if d >= param then
      fy, fm = y, m
      if m == 12 then ty, tm = y + 1, 1 else ty, tm = y, m + 1 end
    else
      ty, tm = y, m
      if m == 1 then fy, fm = y - 1, 12 else fy, fm = y, m - 1 end
    end
    return (cal_first(fy, fm) + param - 1) * CAL_DAY, (cal_first(ty, tm) + param - 1) * CAL_DAY
  end
  local off = 0
  if unit ~= 3 and param > 0 then off = (param - 2048) * 60000000 end
  local shifted = now + off
  if shifted < 0 then shifted = 0 end
  local day = floor(shifted / CAL_DAY)
  if unit == 1 then
    return day * CAL_DAY - off, (day + 1) * CAL_DAY - off
  elseif unit == 2 then
    local since_monday = (day + 3) % 7
    return (day - since_monday) * CAL_DAY - off, (day + 7 - since_monday) * CAL_DAY - off
  end
  local y, m = cal_civil(day)
  local ny, nm = y, m + 1
  if m == 12 then ny, nm = y + 1, 1 end
  return cal_first(y, m) * CAL_DAY, cal_first(ny, nm) * CAL_DAY
end
