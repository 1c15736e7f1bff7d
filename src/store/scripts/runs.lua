-- runs.lua: the decide script's replay mode ('r'). It comes first in the script (one script:
-- src/store/redis/script.rs SOURCE: state.lua, runs.lua, response.lua, decide.lua) and returns before the
-- rest runs, so a call in this mode pays for nothing of the per-request path: no closures, no
-- tables but its own. The calling convention is decide.lua's, with the requests sent as runs:
-- R runs, each "k·16 + n" then its n (definition, key) pairs.
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
  local floor = math.floor
  local byte = string.byte
  local call = redis.call
  local now
  if ARGV[1] ~= '' then
    now = tonumber(ARGV[1])
  else
    local t = call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end

  -- How many requests of a run of k (each costing C, all at `now`) the limit admits from its state
  -- (s1, s2, s3 as decide.lua keeps it): request i is admitted while i * step <= room.
  local function run_capacity(alg, L, P, B, C, now, a, b, c, k)
    local floor = math.floor
    local room, step
    if alg == 'fw' then
      local count = 0
      if a == floor(now / P) then count = b end
      room, step = L - count, C
    elseif alg == 'sw' then
      local w = floor(now / P)
      local elapsed = now - w * P
      local curr, prev = 0, 0
      if a == w then curr, prev = b, c elseif a and a + 1 == w and b > 0 then prev = b end
      -- decide.lua: weighted + C·P <= L·P, weighted growing by C·P per admitted request.
      room, step = L * P - (prev * (P - elapsed) + curr * P), C * P
    elseif alg == 'tb' then
      room, step = tb_level(L, P, B, now, a, b), C * P
    elseif alg == 'gcra' then
      local T = floor(P / L)
      if T < 1 then T = 1 end
      local base = tat_base(P, now, a, b)
      -- base + i·C·T − now <= B·T
      room, step = B * T - (base - now), C * T
    else -- lb: the i-th waits base − now + (i − 1)·C·T <= B·T
      local T = floor(P / L)
      if T < 1 then T = 1 end
      local base = tat_base(P, now, a, b)
      room, step = B * T - (base - now) + C * T, C * T
    end
    if room < step then return 0 end
    local n = floor(room / step)
    if n > k then return k end
    return n
  end

  -- The state after m requests of a run are charged.
  local function run_charge(alg, L, P, B, C, now, a, b, c, m)
    local floor = math.floor
    if alg == 'fw' then
      local w = floor(now / P)
      local count = 0
      if a == w then count = b end
      return w, count + m * C, nil
    elseif alg == 'sw' then
      local w = floor(now / P)
      local curr, prev = 0, 0
      if a == w then curr, prev = b, c elseif a and a + 1 == w and b > 0 then prev = b end
      return w, curr + m * C, prev
    elseif alg == 'tb' then
      return tb_level(L, P, B, now, a, b) - m * C * P, now, nil
    else -- gcra, lb: a TAT before now is kept as credit
      local T = floor(P / L)
      if T < 1 then T = 1 end
      local tat = tat_base(P, now, a, b) + m * C * T
      if tat < now then return now, now - tat, nil end
      return tat, 0, nil
    end
  end

  -- Definitions, flat: algorithm, L, P, B, C, flags at 6·(d − 1) + 1 … 6.
  local D = tonumber(ARGV[3])
  local DF = {}
  for i = 4, 3 + D * 6 do
    local v = ARGV[i]
    local f = (i - 4) % 6
    if f >= 1 and f <= 4 then v = tonumber(v) end
    DF[i - 3] = v
  end
  -- The reply is `now`, then 4 integers per key: its state before the batch (present, s1, s2,
  -- s3), written at the key's first use. A1..A3: the keys' states as the runs charge them.
  local reply = {now}
  local A1, A2, A3, KD, W = {}, {}, {}, {}, {}
  local jd, jk, jc = {}, {}, {}
  local p = 4 + D * 6
  local R = tonumber(ARGV[p])
  p = p + 1
  for _ = 1, R do
    local h = tonumber(ARGV[p])
    p = p + 1
    local n = h % 16
    local k = (h - n) / 16
    local admitted = k
    for j = 1, n do
      local d, ki = tonumber(ARGV[p]), tonumber(ARGV[p + 1])
      p = p + 2
      local o = 6 * (d - 1)
      local alg = DF[o + 1]
      local r = 4 * ki - 2
      if not reply[r] then
        local a, b, c = state_read(call('GET', KEYS[ki]), alg)
        if a then reply[r] = 1 else reply[r] = 0 end
        reply[r + 1], reply[r + 2], reply[r + 3] = a or 0, b or 0, c or 0
        A1[ki], A2[ki], A3[ki] = a, b, c
      end
      local flags = DF[o + 6]
      local cap = run_capacity(alg, DF[o + 2], DF[o + 3], DF[o + 4], DF[o + 5], now, A1[ki], A2[ki], A3[ki], k)
      -- A limit charged after the response is never charged here: it admits all or none.
      if cap > 0 and byte(flags, 2) == 97 then cap = k end
      jd[j], jk[j], jc[j] = d, ki, cap
      if cap < admitted and byte(flags, 1) ~= 49 then admitted = cap end
    end
    for j = 1, n do
      -- A shadow limit is charged only for the requests it admitted itself.
      local m = jc[j]
      if m > admitted then m = admitted end
      local o = 6 * (jd[j] - 1)
      if m > 0 and byte(DF[o + 6], 2) ~= 97 then
        local ki = jk[j]
        A1[ki], A2[ki], A3[ki] = run_charge(DF[o + 1], DF[o + 2], DF[o + 3], DF[o + 4], DF[o + 5], now, A1[ki], A2[ki], A3[ki], m)
        if not KD[ki] then W[#W + 1] = ki end
        KD[ki] = jd[j]
      end
    end
  end

  -- One write per charged key (state.lua).
  for i = 1, #W do
    local ki = W[i]
    local o = 6 * (KD[ki] - 1)
    local r = 4 * ki - 2
    state_write(KEYS[ki], DF[o + 1], DF[o + 2], DF[o + 3], DF[o + 4], now, A1[ki], A2[ki], A3[ki],
      reply[r] == 1 and reply[r + 1] == A1[ki])
  end
  return reply
end
