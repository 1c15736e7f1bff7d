-- runs.lua: helpers of decide.lua's replay mode ('r'), prepended to it (one script:
-- src/store/redis/script.rs SOURCE). Pure functions of their arguments.
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
-- a calendar window is computed by the gateway.

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
    if a == w then curr, prev = b, c elseif a and a + 1 == w then prev = b end
    -- decide.lua: weighted + C·P <= L·P, weighted growing by C·P per admitted request.
    room, step = L * P - (prev * (P - elapsed) + curr * P), C * P
  elseif alg == 'tb' then
    local full = B * P
    local level = full
    if a then
      local since = now - b
      if since < 0 then since = 0 end
      level = a + since * L
      if level > full then level = full end
    end
    room, step = level, C * P
  elseif alg == 'gcra' then
    local T = floor(P / L)
    if T < 1 then T = 1 end
    local base = a or 0
    if base < now then base = now end
    -- base + i·C·T − now <= B·T
    room, step = B * T - (base - now), C * T
  else -- lb: the i-th waits base − now + (i − 1)·C·T <= B·T
    local T = floor(P / L)
    if T < 1 then T = 1 end
    local base = a or 0
    if base < now then base = now end
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
    if a == w then curr, prev = b, c elseif a and a + 1 == w then prev = b end
    return w, curr + m * C, prev
  elseif alg == 'tb' then
    local full = B * P
    local level = full
    if a then
      local since = now - b
      if since < 0 then since = 0 end
      level = a + since * L
      if level > full then level = full end
    end
    return level - m * C * P, now, nil
  else -- gcra, lb
    local T = floor(P / L)
    if T < 1 then T = 1 end
    local base = a or 0
    if base < now then base = now end
    return base + m * C * T, nil, nil
  end
end
