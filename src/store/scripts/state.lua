-- state.lua: one key's state as a string, for fw, cw, sw, tb, gcra and lb; first in the script
-- (src/store/redis/script.rs SOURCE), shared by runs.lua and decide.lua.
--
-- The state is (s1, s2, s3): fw/cw window and count; sw window, curr and prev; tb level and
-- last; gcra/lb the TAT and the credit. It is stored as struct.pack('<Bd…', 1, numbers…); the
-- decimal form of earlier versions ("a:b", "a:b:c", "tat") is still read.
--
-- After support granted units beyond the quota (quota.lua) a state holds credit, which lapses
-- on its own (src/limiter/algorithm.rs, the same rules): a fw/cw count or sw curr below 0 (until
-- the window ends; a sw window that ended in credit weighs as 0 in the next); a tb level above
-- B·P (no refill adds to it; it lapses, the bucket full, a period after `last`); a gcra/lb credit
-- in µs (a request counts from max(TAT, now) − credit; with a credit the TAT is when it was
-- written, and it lapses a period later). A gcra/lb state without credit is one number.

-- The state in `v` (a GET's reply, false when the key is missing) for algorithm `alg`.
local function state_read(v, alg)
  if not v then return nil end
  if string.byte(v, 1) == 1 then
    if alg == 'sw' then
      local _, a, b, c = struct.unpack('<Bddd', v)
      return a, b, c
    elseif alg == 'gcra' or alg == 'lb' then
      if #v > 9 then
        local _, a, b = struct.unpack('<Bdd', v)
        return a, b
      end
      local _, a = struct.unpack('<Bd', v)
      return a
    end
    local _, a, b = struct.unpack('<Bdd', v)
    return a, b
  end
  if alg == 'sw' then
    local a, b, c = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+)$')
    return tonumber(a), tonumber(b), tonumber(c)
  elseif alg == 'gcra' or alg == 'lb' then
    return tonumber(v)
  end
  local a, b = string.match(v, '^(%-?%d+):(%-?%d+)$')
  return tonumber(a), tonumber(b)
end

-- When the key holding this state may expire (µs): when the state stops mattering — the
-- window's end (cw: P is the calendar window's end), the end of the next window (sw), a full
-- bucket (tb; a period after `last` for granted tokens above the burst), the TAT (gcra, lb; a
-- period after it with a credit) — and for the buckets rounded up to the next multiple of the
-- period, so that the many writes of one period give one expiry: the key's TTL is set once a
-- period and kept (`SET … KEEPTTL`) by the other writes (state_write). At most one period
-- later than needed.
local function state_expiry(alg, L, P, B, a, b, c)
  if alg == 'fw' then
    return (a + 1) * P
  elseif alg == 'cw' then
    return P
  elseif alg == 'sw' then
    return (a + 2) * P
  end
  local needed
  if alg == 'tb' then
    if a > B * P then
      needed = b + P
    else
      local x = B * P - a + L - 1
      needed = b + (x - x % L) / L
    end
  elseif b and b > 0 then
    needed = a + P
  else
    needed = a
  end
  -- floor(needed / P) + 1 periods, in exact integer arithmetic (no math.floor call)
  return needed - needed % P + P
end

-- The expiry the key read with this state already has (state_expiry of what was written), or
-- nil when it is not known (a calendar window's key read in another window: its end is not P).
-- The state's format did not change with the grid, so that a gateway of an earlier version
-- still reads what this one writes: a bucket key last written by such a gateway has the TTL
-- its state needed, which may end before the grid's; kept by a write of this version, the key
-- can then end early, losing what was charged since — at most what one period's requests
-- charged — only while both versions run.
local function state_kept(alg, L, P, B, a, b, c)
  if not a then return nil end
  if alg == 'cw' and a ~= B then return nil end
  return state_expiry(alg, L, P, B, a, b, c)
end

-- Writes the state to `key` with a TTL that ends at state_expiry. L, P, B: the limit's
-- definition. `kept`: the expiry the key was read with (state_kept); when it is the new state's
-- expiry too, `SET … KEEPTTL` keeps it (no TTL to compute, format or set). `ttls` (optional): a
-- table of TTL strings by expiry, shared by a call's writes (many keys of a batch share an
-- expiry: formatting a number is a printf).
local function state_write(key, alg, L, P, B, now, a, b, c, kept, ttls)
  local value
  if alg == 'sw' then
    value = struct.pack('<Bddd', 1, a, b, c)
  elseif (alg == 'gcra' or alg == 'lb') and not (b and b > 0) then
    value = struct.pack('<Bd', 1, a)
  else
    value = struct.pack('<Bdd', 1, a, b)
  end
  local expires = state_expiry(alg, L, P, B, a, b, c)
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

-- A token bucket's level (tokens × P) at `now`: `level` refilled at L per µs since `last`, at
-- most B·P; a full bucket when there is no state. Granted tokens above B·P are kept as they are
-- (refill stops at the burst and never cuts them) until a period passes without a request.
local function tb_level(L, P, B, now, level, last)
  local full = B * P
  if not level then return full end
  if level > full then
    if now - last < P then return level end
    return full
  end
  local since = now - last
  if since < 0 then since = 0 end
  level = level + since * L
  if level > full then return full end
  return level
end

-- GCRA / leaky bucket (src/limiter/algorithm.rs tat_base): where a request at `now` counts from,
-- max(TAT, now), less the granted credit while it lives (a period after it was written); `now`
-- when there is no state. decide.lua's per-request loop has it inline.
local function tat_base(P, now, tat, credit)
  if not tat then return now end
  local base = tat
  if base < now then base = now end
  if credit and credit > 0 and now - tat < P then base = base - credit end
  return base
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
    q = math.floor(exact / P)
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
-- definition's P: 1 day, 2 week, 3 month. Computed here from the script's `now` (Redis TIME),
-- so a gateway whose clock is skewed cannot move a quota's window (one clock per decision).
-- Day numbers and µs stay below 2^53: Lua's doubles are exact.
local CAL_DAY = 86400000000

-- (year, month) of a day number since 1970-01-01 (Howard Hinnant's civil_from_days).
local function cal_civil(days)
  local floor = math.floor
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
  local floor = math.floor
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
  local param = math.floor(code / 16)
  if unit == 3 and param > 1 then
    local day = math.floor(now / CAL_DAY)
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
  local day = math.floor(shifted / CAL_DAY)
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
