-- runs.lua: the decide script's replay mode ('r'). It comes first in the script (one script:
-- src/store/redis/script.rs SOURCE: state.lua, runs.lua, response.lua, decide.lua) and returns before the
-- rest runs, so a call in this mode pays for nothing of the per-request path: no closures, no
-- tables but its own. The calling convention is decide.lua's up to the definitions; then one
-- argument holds the runs, each "k·16 + n" then its n (definition, key) pairs, every number as
-- two characters ('0' + x % 64, '0' + x / 64: no argument and no strtod per number).
--
-- In mode 'r' a batch arrives as runs: k identical requests (the same limits on the same keys)
-- sent once with their count. Every request of a batch is decided at the same `now`, and a
-- limit's state changes only when it is charged, so a run's outcome is monotone: if a limit
-- denies the i-th request of a run, it denies every later one too. How many of a run a limit
-- admits is therefore one division, not k decisions, and charging m of them is one step.
-- The gateway replays the batch request by request from the states the script read (its reply)
-- with the same pure algorithms as the in-process store (src/limiter/algorithm.rs), so every
-- request's decision is computed exactly as decide.lua's per-request loop would.
--
-- Only fw, sw, tb, gcra and lb take this path (the gateway sends the rest in mode 'c'): the
-- sliding log's state is a list, a concurrency limit's requests differ in their lease ids, and
-- a calendar window is computed by decide.lua's definitions.

if ARGV[2] == 'r' then
  local call = redis.call
  -- Numbers are read with `+ 0`, not tonumber(): Lua 5.1's tonumber converts a string twice
  -- (lua_isnumber, then lua_tonumber), each a strtod.
  local now
  if ARGV[1] ~= '' then
    now = ARGV[1] + 0
  else
    local t = call('TIME')
    now = t[1] * 1000000 + t[2]
  end

  -- How many requests of a run of k (each costing C, all at `now`) the limit admits from its state
  -- (s1, s2, s3 as decide.lua keeps it): request i is admitted while i * step <= room.
  local function run_capacity(alg, L, P, B, C, a, b, c, k)
    local room, step
    if alg == 'gcra' or alg == 'lb' then
      local T = (P - P % L) / L
      if T < 1 then T = 1 end
      -- state.lua tat_base, inline.
      local base = now
      if a then
        if a > now then base = a end
        if b and b > 0 and now - a < P then base = base - b end
      end
      step = C * T
      -- gcra: base + i·C·T − now <= B·T; lb: the i-th waits base − now + (i − 1)·C·T <= B·T
      room = B * T - (base - now)
      if alg == 'lb' then room = room + step end
    elseif alg == 'fw' then
      local count = 0
      if a == (now - now % P) / P then count = b end
      room, step = L - count, C
    elseif alg == 'sw' then
      local elapsed = now % P
      local w = (now - elapsed) / P
      local curr, prev = 0, 0
      if a == w then curr, prev = b, c elseif a and a + 1 == w and b > 0 then prev = b end
      -- decide.lua: weighted + C·P <= L·P, weighted growing by C·P per admitted request.
      room, step = L * P - (prev * (P - elapsed) + curr * P), C * P
    else -- tb
      room, step = tb_level(L, P, B, now, a, b), C * P
    end
    if room < step then return 0 end
    local n = (room - room % step) / step
    if n > k then return k end
    return n
  end

  -- The state after m requests of a run are charged.
  local function run_charge(alg, L, P, B, C, a, b, c, m)
    if alg == 'gcra' or alg == 'lb' then -- a TAT before now is kept as credit
      local T = (P - P % L) / L
      if T < 1 then T = 1 end
      local tat = now
      if a then
        if a > now then tat = a end
        if b and b > 0 and now - a < P then tat = tat - b end
      end
      tat = tat + m * C * T
      if tat < now then return now, now - tat, nil end
      return tat, 0, nil
    elseif alg == 'fw' then
      local w = (now - now % P) / P
      local count = 0
      if a == w then count = b end
      return w, count + m * C, nil
    elseif alg == 'sw' then
      local w = (now - now % P) / P
      local curr, prev = 0, 0
      if a == w then curr, prev = b, c elseif a and a + 1 == w and b > 0 then prev = b end
      return w, curr + m * C, prev
    end
    return tb_level(L, P, B, now, a, b) - m * C * P, now, nil -- tb
  end

  -- Definitions, 7 entries each at 7·(d − 1) + 1 …: algorithm, L, P, B, C, shadow, charged
  -- after the response.
  local D = ARGV[3] + 0
  local DF = {}
  for d = 0, D - 1 do
    local a, o = 3 + d * 6, d * 7
    local flags = ARGV[a + 6]
    DF[o + 1], DF[o + 2], DF[o + 3], DF[o + 4], DF[o + 5] =
      ARGV[a + 1], ARGV[a + 2] + 0, ARGV[a + 3] + 0, ARGV[a + 4] + 0, ARGV[a + 5] + 0
    DF[o + 6], DF[o + 7] = string.byte(flags, 1) == 49, string.byte(flags, 2) == 97
  end
  -- The reply is `now`, then 4 integers per key: its state before the batch (present, s1, s2,
  -- s3), written at the key's first use. A1..A3: the keys' states as the runs charge them.
  -- Every key of this mode is a string: all read by one MGET (one command, not one per key).
  local vals = call('MGET', unpack(KEYS))
  local reply = {now}
  local A1, A2, A3, KD, KX, W = {}, {}, {}, {}, {}, {}
  local jo, jk, jc = {}, {}, {}
  -- The runs, one argument: every number as two characters, '0' + x % 64 then '0' + x / 64
  -- (src/store/redis/script.rs RUN_DIGITS), all read by one string.byte.
  local RS = ARGV[4 + D * 6]
  local X = {string.byte(RS, 1, #RS)}
  local p, last = 1, #RS
  while p < last do
    local h = X[p] + X[p + 1] * 64 - 3120 -- 3120 = 48 + 48 * 64
    p = p + 2
    local n = h % 16
    local k = (h - n) / 16
    local admitted = k
    for j = 1, n do
      local o, ki = (X[p] + X[p + 1] * 64 - 3121) * 7, X[p + 2] + X[p + 3] * 64 - 3120
      p = p + 4
      local alg = DF[o + 1]
      local r = 4 * ki - 2
      if not reply[r] then
        local a, b, c
        local v = vals[ki]
        if v then a, b, c = state_read(v, alg) end
        if a then
          reply[r], reply[r + 1], reply[r + 2], reply[r + 3] = 1, a, b or 0, c or 0
          A1[ki], A2[ki], A3[ki] = a, b, c
          KX[ki] = state_kept(alg, DF[o + 2], DF[o + 3], DF[o + 4], a, b, c)
        else
          reply[r], reply[r + 1], reply[r + 2], reply[r + 3] = 0, 0, 0, 0
        end
      end
      local cap = run_capacity(alg, DF[o + 2], DF[o + 3], DF[o + 4], DF[o + 5], A1[ki], A2[ki], A3[ki], k)
      -- A limit charged after the response is never charged here: it admits all or none.
      if cap > 0 and DF[o + 7] then cap = k end
      jo[j], jk[j], jc[j] = o, ki, cap
      if cap < admitted and not DF[o + 6] then admitted = cap end
    end
    for j = 1, n do
      -- A shadow limit is charged only for the requests it admitted itself.
      local m = jc[j]
      if m > admitted then m = admitted end
      local o = jo[j]
      if m > 0 and not DF[o + 7] then
        local ki = jk[j]
        A1[ki], A2[ki], A3[ki] = run_charge(DF[o + 1], DF[o + 2], DF[o + 3], DF[o + 4], DF[o + 5], A1[ki], A2[ki], A3[ki], m)
        if not KD[ki] then W[#W + 1] = ki end
        KD[ki] = o
      end
    end
  end

  -- One write per charged key (state.lua).
  local ttls = {}
  for i = 1, #W do
    local ki = W[i]
    local o = KD[ki]
    state_write(KEYS[ki], DF[o + 1], DF[o + 2], DF[o + 3], DF[o + 4], now, A1[ki], A2[ki], A3[ki], KX[ki], ttls)
  end
  return reply
end
