-- decide.lua: decides every limit of a batch of requests, each request all-or-nothing, in one
-- atomic step. Requests are decided in order; a later one sees what an earlier one charged.
--
-- Coalesced by key: a key is read once per batch (at its first use), every decision on it runs
-- on its state in the script's memory, and it is written once at the end (only when a request
-- charged it). A `global` limit or a busy API key costs one GET and one SET per batch, however
-- many of the batch's requests it decides.
--
-- The same arithmetic as src/limiter/algorithm.rs, line for line (the differential test holds the
-- two to it). Every number stays below 2^53, so Lua's doubles are exact.
-- A Lua script rather than MULTI/EXEC: a decision must read before it writes, and a key can
-- change or expire between MULTI's commands; the script runs with nothing in between.
--
-- KEYS      the batch's distinct state keys: <prefix>:{<route>:<limit>:<subject-hash>}:<alg>.
--           fw, cw, sw, tb, gcra and lb state is one string (state.lua). sl is a
--           sorted set of "ts:cost:seq" members scored by ts. cc (concurrency) is a sorted set of
--           lease ids scored by their expiry (response.lua).
-- ARGV[1]   '' to use Redis TIME, or the time in microseconds since the epoch (an injected clock)
-- ARGV[2]   'c' to decide and charge ('r': the same, the batch sent as runs: runs.lua); 'e' to
--           evaluate only, writing nothing (the first phase of a Redis Cluster decision whose
--           limits span several slots); 'f' to settle what
--           answered requests owe: charge C whatever is left (clamped to a spent limit), or
--           release a cc lease — never denied, replying 1 for each
-- ARGV[3]   D, the number of limit definitions; then D definitions of 6 arguments:
--           algorithm (fw|sw|sl|tb|gcra|lb|cw|cc), L, P (µs), B, C, flags: shadow (1|0), then
--           'a' for a limit charged after the response (evaluated, never charged by 'c'), or
--           'l<N>' for a lease of up to N units (its reply's delay is the units granted), or 'r'
--           (mode 'f') to give C leased units back (lease.lua). cw is a
--           fixed window aligned to the UTC calendar: P is its unit (1 day, 2 week, 3 month)
--           and B is 0; the script turns them into the window containing `now` (state.lua
--           cal_window): P its end and B its start (µs). Its state is fw's, with the start as
--           the window.
-- then      R, the number of requests; then for each request: its number of limits n, and for
--           each limit: its definition's index (1-based) and its key's index in KEYS, and for a
--           cc limit its lease id ('0' in mode 'c': evaluate, take no slot).
-- Reply     6 integers per limit of every request, in order: allowed (1|0), limit, remaining,
--           retry_after µs, reset_after µs, delay µs. A request charges only when every
--           non-shadow limit of it admits it, and then only the limits that admitted it. Every
--           written key gets a TTL that ends when its state no longer matters.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local floor = math.floor
local match = string.match
local call = redis.call
local function max(a, b) if a > b then return a end return b end
local function min(a, b) if a < b then return a end return b end
local function ceil_div(a, b) if b == 0 then return 0 end return floor((a + b - 1) / b) end
local function ttl_ms(expires) return max(ceil_div(expires - now, 1000), 1) end
local function fmt(n) return string.format('%d', n) end

-- Limit definitions.
local D = tonumber(ARGV[3])
local ALG, LL, PP, BB, CC, SH = {}, {}, {}, {}, {}, {}
local AF = {}
local LN, RT = {}, {} -- lease: up to N units (flags 'l<N>'); give units back (flags 'r')
for d = 1, D do
  local a = 3 + (d - 1) * 6
  ALG[d] = ARGV[a + 1]
  LL[d], PP[d], BB[d], CC[d] = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  SH[d] = string.sub(ARGV[a + 6], 1, 1) == '1'
  AF[d] = string.sub(ARGV[a + 6], 2, 2) == 'a'
  LN[d] = tonumber(match(ARGV[a + 6], 'l(%d+)'))
  RT[d] = string.find(ARGV[a + 6], 'r', 2, true) ~= nil
  if ALG[d] == 'cw' then
    -- The calendar unit (P) becomes the window at this script's `now`: B its start, P its end.
    BB[d], PP[d] = cal_window(PP[d], now)
  end
end

-- Per key: loaded state (s1, s2, s3; sl: timestamps, costs and their sum), the definition that
-- wrote it, whether a request charged it, and (sl) the members to add.
local loaded, kdef, dirty = {}, {}, {}
local s1, s2, s3 = {}, {}, {}
local lts, lcost, adds = {}, {}, {}
local rems = {} -- cc: lease ids to release
local lw = {} -- the expiry each key was read with (state_kept): kept while the state's is the same

local function load(ki, d)
  loaded[ki] = true
  local key = KEYS[ki]
  local alg = ALG[d]
  if alg == 'cc' then
    s1[ki], adds[ki], rems[ki] = cc_count(key, now), {}, {}
    return
  end
  if alg == 'sl' then
    local items = call('ZRANGEBYSCORE', key, '(' .. fmt(now - PP[d]), '+inf', 'WITHSCORES')
    local ts, costs, sum = {}, {}, 0
    for i = 1, #items, 2 do
      local c = tonumber(match(items[i], '^%-?%d+:(%d+):'))
      ts[#ts + 1] = tonumber(items[i + 1])
      costs[#costs + 1] = c
      sum = sum + c
    end
    lts[ki], lcost[ki], s1[ki], adds[ki] = ts, costs, sum, {}
    return
  end
  s1[ki], s2[ki], s3[ki] = state_read(call('GET', key), alg)
  lw[ki] = state_kept(alg, LL[d], PP[d], BB[d], s1[ki], s2[ki], s3[ki])
end

local reply = {}
local r = 0 -- reply entries so far
local p = 4 + D * 6
local R = tonumber(ARGV[p])
p = p + 1
local charge = ARGV[2] == 'c'
-- One request's limits: definition, key, verdict and the state a charge would leave.
local jd, jk, jok, n1, n2, n3 = {}, {}, {}, {}, {}, {}
local jl = {} -- cc: the lease id

-- Mode 'f': settle. Each limit on its own; nothing is evaluated or denied.
if ARGV[2] == 'f' then
  for _ = 1, R do
    local n = tonumber(ARGV[p])
    p = p + 1
    for _ = 1, n do
      local d, ki = tonumber(ARGV[p]), tonumber(ARGV[p + 1])
      p = p + 2
      if not loaded[ki] then load(ki, d) end
      local alg = ALG[d]
      if alg == 'cc' then
        local rm = rems[ki]
        rm[#rm + 1] = ARGV[p]
        p = p + 1
      elseif alg == 'sl' then
        local u = min(CC[d], LL[d] - s1[ki])
        if u > 0 then
          local ts, costs = lts[ki], lcost[ki]
          local i = #ts + 1
          while i > 1 and ts[i - 1] > now do
            ts[i], costs[i] = ts[i - 1], costs[i - 1]
            i = i - 1
          end
          ts[i], costs[i] = now, u
          s1[ki] = s1[ki] + u
          local a = adds[ki]
          a[#a + 1] = u
        end
      elseif RT[d] then
        if s1[ki] ~= nil then
          s1[ki], s2[ki], s3[ki] = return_state(alg, LL[d], PP[d], BB[d], CC[d], now, s1[ki], s2[ki], s3[ki])
        end
      else
        s1[ki], s2[ki], s3[ki] = force_state(alg, LL[d], PP[d], BB[d], CC[d], now, s1[ki], s2[ki], s3[ki])
      end
      if s1[ki] ~= nil or not RT[d] then kdef[ki], dirty[ki] = d, true end
      reply[r + 1], reply[r + 2], reply[r + 3] = 1, LL[d], 0
      reply[r + 4], reply[r + 5], reply[r + 6] = 0, 0, 0
      r = r + 6
    end
  end
  R = 0
end

for _ = 1, R do
  local n = tonumber(ARGV[p])
  p = p + 1
  local admitted = charge
  for j = 1, n do
    local d, ki = tonumber(ARGV[p]), tonumber(ARGV[p + 1])
    p = p + 2
    if ALG[d] == 'cc' then
      jl[j] = ARGV[p]
      p = p + 1
    end
    if not loaded[ki] then load(ki, d) end
    local alg = ALG[d]
    local L, P, B, C = LL[d], PP[d], BB[d], CC[d]
    local ok, limit, remaining, retry, reset, delay = false, L, 0, 0, 0, 0
    if LN[d] then
      -- A lease: decided as one request costing what it gets (lease.lua).
      local avail = lease_avail(alg, L, P, B, now, s1[ki], s2[ki])
      if avail >= C then
        local g = min(LN[d], avail)
        g = g - g % C -- whole requests' costs
        if g > C then C = g end
      end
    end

    if alg == 'fw' or alg == 'cw' then
      local w, wend = B, P
      if alg == 'fw' then w = floor(now / P); wend = (w + 1) * P end
      local count = 0
      if s1[ki] == w then count = s2[ki] end
      reset = max(wend - now, 0)
      ok = count + C <= L
      if ok then remaining = max(L - count - C, 0) else remaining = max(L - count, 0); retry = reset end
      n1[j], n2[j] = w, count + C

    elseif alg == 'sw' then
      local w = floor(now / P)
      local elapsed = now - w * P
      local curr, prev = 0, 0
      local sw = s1[ki]
      if sw then
        if sw == w then curr = s2[ki]; prev = s3[ki]
        elseif sw + 1 == w and s2[ki] > 0 then prev = s2[ki] end -- credit lapsed with its window
      end
      local weighted = prev * (P - elapsed) + curr * P
      ok = weighted + C * P <= L * P
      local used = weighted
      if ok then used = used + C * P end
      remaining = floor(max(L * P - used, 0) / P)
      if not ok then
        if curr + C <= L then
          local needed = P - floor((L - curr - C) * P / max(prev, 1))
          retry = max(needed - elapsed, 1)
        else
          local nxt = 0
          if curr > 0 then nxt = max(P - floor((L - C) * P / curr), 0) end
          retry = P - elapsed + nxt
        end
      end
      local curr_after = curr
      if ok then curr_after = curr + C end
      if curr_after > 0 then reset = 2 * P - elapsed
      elseif prev > 0 or curr_after < 0 then reset = P - elapsed end
      n1[j], n2[j], n3[j] = w, curr + C, prev

    elseif alg == 'sl' then
      local ts, costs, sum = lts[ki], lcost[ki], s1[ki]
      ok = sum + C <= L
      if ok then
        remaining = max(L - sum - C, 0)
        reset = P
      else
        remaining = max(L - sum, 0)
        retry = P
        local freed = 0
        for i = 1, #ts do
          freed = freed + costs[i]
          if sum - freed + C <= L then retry = ts[i] + P - now; break end
        end
        if #ts > 0 then reset = ts[#ts] + P - now end
      end

    elseif alg == 'tb' then
      local full = B * P
      local level = tb_level(L, P, B, now, s1[ki], s2[ki])
      local need = C * P
      ok = level >= need
      local after = level
      if ok then after = level - need else retry = ceil_div(need - level, L) end
      limit = B
      remaining = floor(after / P)
      -- Granted tokens above the burst lapse a period after this request.
      if after > full then reset = P else reset = ceil_div(full - after, L) end
      n1[j], n2[j] = after, now

    elseif alg == 'gcra' or alg == 'lb' then
      local T = max(floor(P / L), 1)
      local tat = s1[ki] or 0
      local base = max(tat, now)
      -- state.lua tat_base, inline: a granted credit counts from before now while it lives.
      local cr = s2[ki]
      if cr and cr > 0 and now - tat < P then base = base - cr end
      local new_tat = base + C * T
      local tat_after = base
      if alg == 'gcra' then
        local tolerance = B * T
        ok = new_tat - now <= tolerance
        if ok then tat_after = new_tat else retry = new_tat - now - tolerance end
        limit = B
        remaining = floor(max(tolerance - (tat_after - now), 0) / T)
        reset = tat_after - now
      else
        local max_wait = B * T
        local wait = base - now
        ok = wait <= max_wait
        if ok then
          tat_after = new_tat
          delay = wait
          if delay < 0 then delay = 0 end -- a slot before now (credit) goes at once
        else
          retry = wait - max_wait
        end
        limit = B + 1
        local next_wait = tat_after - now
        if next_wait <= max_wait then remaining = floor((max_wait - next_wait) / T) + 1 end
        reset = next_wait
      end
      -- A TAT before now is kept as credit, relative to now; it lapses a period after this.
      if reset < 0 then reset = P end
      if new_tat < now then n1[j], n2[j] = now, now - new_tat else n1[j], n2[j] = new_tat, 0 end

    elseif alg == 'cc' then
      ok = s1[ki] + C <= L
      if ok then remaining = L - s1[ki] - C else remaining = max(L - s1[ki], 0); retry = 1000000 end

    else
      return redis.error_reply('tollgate: unknown algorithm ' .. tostring(alg))
    end

    if LN[d] then
      if ok then delay = C else delay = 0 end
    end
    if not ok and not SH[d] then admitted = false end
    jd[j], jk[j], jok[j] = d, ki, ok
    local flag = 0
    if ok then flag = 1 end
    reply[r + 1], reply[r + 2], reply[r + 3] = flag, limit, remaining
    reply[r + 4], reply[r + 5], reply[r + 6] = retry, reset, delay
    r = r + 6
  end

  if admitted then
    for j = 1, n do
      local d = jd[j]
      if jok[j] and not AF[d] and (ALG[d] ~= 'cc' or jl[j] ~= '0') then
        local ki = jk[j]
        kdef[ki], dirty[ki] = d, true
        if ALG[d] == 'cc' then
          local a = adds[ki]
          a[#a + 1] = jl[j]
          s1[ki] = s1[ki] + CC[d]
        elseif ALG[d] == 'sl' then
          -- Kept in time order (a clock that stepped back leaves later entries).
          local ts, costs = lts[ki], lcost[ki]
          local i = #ts + 1
          while i > 1 and ts[i - 1] > now do
            ts[i], costs[i] = ts[i - 1], costs[i - 1]
            i = i - 1
          end
          ts[i], costs[i] = now, CC[d]
          s1[ki] = s1[ki] + CC[d]
          local a = adds[ki]
          a[#a + 1] = CC[d]
        else
          s1[ki], s2[ki], s3[ki] = n1[j], n2[j], n3[j]
        end
      end
    end
  end
end

-- One write per charged key.
for ki, _ in pairs(dirty) do
  local d = kdef[ki]
  local alg, P = ALG[d], PP[d]
  local key = KEYS[ki]
  if alg == 'sl' then
    call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - P))
    local seq = call('ZCARD', key)
    local args = {}
    local t = fmt(now)
    for i, c in ipairs(adds[ki]) do
      args[#args + 1] = t
      args[#args + 1] = t .. ':' .. fmt(c) .. ':' .. fmt(seq + i - 1)
    end
    if #args > 0 then call('ZADD', key, unpack(args)) end
    call('PEXPIRE', key, ttl_ms(now + P))
  elseif alg == 'cc' then
    cc_write(key, now, P, adds[ki], rems[ki])
  else
    state_write(key, alg, LL[d], P, BB[d], now, s1[ki], s2[ki], s3[ki], lw[ki])
  end
end

return reply
