-- state.lua: one key's state as a string, for fw, cw, sw, tb, gcra and lb; first in the script
-- (src/store/redis/script.rs SOURCE), shared by runs.lua and decide.lua.
--
-- The state is (s1, s2, s3): fw/cw window and count; sw window, curr and prev; tb level and
-- last; gcra/lb the TAT. It is stored as struct.pack('<Bd…', 1, numbers…); the decimal form of
-- earlier versions ("a:b", "a:b:c", "tat") is still read.

-- The state in `v` (a GET's reply, false when the key is missing) for algorithm `alg`.
local function state_read(v, alg)
  if not v then return nil end
  if string.byte(v, 1) == 1 then
    if alg == 'sw' then
      local _, a, b, c = struct.unpack('<Bddd', v)
      return a, b, c
    elseif alg == 'gcra' or alg == 'lb' then
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

-- Writes the state to `key` with a TTL that ends when it no longer matters: the window's end
-- (cw: P is the calendar window's end), the end of the next window (sw), a full bucket (tb), the
-- TAT (gcra, lb). L, P, B: the limit's definition.
local function state_write(key, alg, L, P, B, now, a, b, c)
  local value, expires
  if alg == 'fw' then
    value, expires = struct.pack('<Bdd', 1, a, b), (a + 1) * P
  elseif alg == 'cw' then
    value, expires = struct.pack('<Bdd', 1, a, b), P
  elseif alg == 'sw' then
    value, expires = struct.pack('<Bddd', 1, a, b, c), (a + 2) * P
  elseif alg == 'tb' then
    value, expires = struct.pack('<Bdd', 1, a, b), now + math.floor((B * P - a + L - 1) / L)
  else
    value, expires = struct.pack('<Bd', 1, a), a
  end
  local ttl = math.floor((expires - now + 999) / 1000)
  if ttl < 1 then ttl = 1 end
  redis.call('SET', key, value, 'PX', ttl)
end

-- A token bucket's level (tokens × P) at `now`: `level` refilled at L per µs since `last`, at
-- most B·P; a full bucket when there is no state.
local function tb_level(L, P, B, now, level, last)
  local full = B * P
  if not level then return full end
  local since = now - last
  if since < 0 then since = 0 end
  level = level + since * L
  if level > full then return full end
  return level
end
