-- decide.lua: decides every limit of one or more requests, each all-or-nothing, in one atomic
-- step. Requests are decided in order; a later one sees what an earlier one charged.
--
-- The same arithmetic as src/limiter/algorithm.rs, line for line (the differential test holds the
-- two to it). Every number stays below 2^53, so Lua's doubles are exact; numbers are written back
-- with string.format('%d') because Lua's tostring keeps only 14 significant digits.
-- A Lua script rather than MULTI/EXEC: a decision must read before it writes, and a key can
-- change or expire between MULTI's commands; the script runs with nothing in between.
--
-- KEYS[i]   state key of limit i: <prefix>:{<route>:<limit>:<subject-hash>}:<fw|sw|sl|tb|gcra|lb>
--           fw "window:count", sw "window:curr:prev", tb "level:last" and gcra/lb "tat" are
--           strings; sl is a sorted set of "ts:cost:seq" members scored by ts.
-- ARGV[1]   '' to use Redis TIME, or the time in microseconds since the epoch (tests inject time)
-- ARGV[2]   'c' to decide and charge; 'e' to evaluate only, writing nothing (the first phase of
--           a Redis Cluster decision whose limits span several slots)
-- ARGV[3]   R, the number of requests; then for each request: its number of limits n, and for
--           each of its limits: algorithm (fw|sw|sl|tb|gcra|lb), L, P (µs), B, C, shadow (1|0).
--           KEYS hold the requests' limit keys in the same order.
-- Reply     6 integers per limit, in order: allowed (1|0), limit, remaining, retry_after µs, reset_after µs,
--           delay µs. A request's state is written only when every non-shadow limit of it admits it, and
--           then only for the limits that admitted it. Every written key gets a TTL that ends
--           when its state no longer matters.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local floor = math.floor
local function fmt(n) return string.format('%d', n) end
local function max(a, b) if a > b then return a end return b end
local function min(a, b) if a < b then return a end return b end
local function ceil_div(a, b) if b == 0 then return 0 end return floor((a + b - 1) / b) end
local function ttl_ms(expires) return max(ceil_div(expires - now, 1000), 1) end
-- Window and bucket states are one string each, "a:b" or "a:b:c" (one GET and one SET PX per
-- decision: fewer calls than a hash with HMGET, HSET and PEXPIRE).
local function parse2(v)
  if not v then return nil end
  local a, b = string.match(v, '^(%-?%d+):(%-?%d+)$')
  return tonumber(a), tonumber(b)
end
local function parse3(v)
  if not v then return nil end
  local a, b, c = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+)$')
  return tonumber(a), tonumber(b), tonumber(c)
end

local reply = {}
local k = 0 -- KEYS used by the requests before this one
local p = 4 -- the ARGV index of this request's limit count

for _ = 1, tonumber(ARGV[3]) do
local n = tonumber(ARGV[p])
p = p + 1
local decisions = {}
local commits = {}

for j = 1, n do
  local a = p + (j - 1) * 6
  local key = KEYS[k + j]
  local alg = ARGV[a]
  local L, P, B, C = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local ok, limit, remaining, retry, reset, delay = false, L, 0, 0, 0, 0
  local commit

  if alg == 'fw' then
    local sw, sc = parse2(redis.call('GET', key))
    local w = floor(now / P)
    local count = 0
    if sw == w then count = sc end
    reset = (w + 1) * P - now
    ok = count + C <= L
    if ok then remaining = max(L - count - C, 0) else remaining = max(L - count, 0); retry = reset end
    commit = function()
      redis.call('SET', key, fmt(w) .. ':' .. fmt(count + C), 'PX', ttl_ms((w + 1) * P))
    end

  elseif alg == 'sw' then
    local sw, sc, sp = parse3(redis.call('GET', key))
    local w = floor(now / P)
    local elapsed = now - w * P
    local curr, prev = 0, 0
    if sw then
      if sw == w then curr = sc; prev = sp
      elseif sw + 1 == w then prev = sc end
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
    if curr_after > 0 then reset = 2 * P - elapsed elseif prev > 0 then reset = P - elapsed end
    commit = function()
      redis.call('SET', key, fmt(w) .. ':' .. fmt(curr + C) .. ':' .. fmt(prev), 'PX', ttl_ms((w + 2) * P))
    end

  elseif alg == 'sl' then
    local cutoff = now - P
    local items = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(cutoff), '+inf', 'WITHSCORES')
    local ts, costs = {}, {}
    local sum = 0
    for k = 1, #items, 2 do
      local c = tonumber(string.match(items[k], '^%-?%d+:(%d+):'))
      ts[#ts + 1] = tonumber(items[k + 1])
      costs[#costs + 1] = c
      sum = sum + c
    end
    ok = sum + C <= L
    if ok then
      remaining = max(L - sum - C, 0)
      reset = P
    else
      remaining = max(L - sum, 0)
      retry = P
      local freed = 0
      for k = 1, #ts do
        freed = freed + costs[k]
        if sum - freed + C <= L then retry = ts[k] + P - now; break end
      end
      if #ts > 0 then reset = ts[#ts] + P - now end
    end
    commit = function()
      redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(cutoff))
      local seq = redis.call('ZCARD', key)
      redis.call('ZADD', key, fmt(now), fmt(now) .. ':' .. fmt(C) .. ':' .. fmt(seq))
      redis.call('PEXPIRE', key, ttl_ms(now + P))
    end

  elseif alg == 'tb' then
    local sl, st = parse2(redis.call('GET', key))
    local full = B * P
    local level = full
    if sl then level = min(full, sl + max(now - st, 0) * L) end
    local need = C * P
    ok = level >= need
    local after = level
    if ok then after = level - need else retry = ceil_div(need - level, L) end
    limit = B
    remaining = floor(after / P)
    reset = ceil_div(full - after, L)
    commit = function()
      redis.call('SET', key, fmt(after) .. ':' .. fmt(now), 'PX', ttl_ms(now + reset))
    end

  elseif alg == 'gcra' or alg == 'lb' then
    local T = max(floor(P / L), 1)
    local tat = tonumber(redis.call('GET', key) or '0')
    local base = max(tat, now)
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
      if ok then tat_after = new_tat; delay = wait else retry = wait - max_wait end
      limit = B + 1
      local next_wait = tat_after - now
      if next_wait <= max_wait then remaining = floor((max_wait - next_wait) / T) + 1 end
      reset = next_wait
    end
    commit = function()
      redis.call('SET', key, fmt(new_tat), 'PX', ttl_ms(new_tat))
    end

  else
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(alg))
  end

  decisions[j] = { ok, limit, remaining, retry, reset, delay }
  commits[j] = commit
end

local admitted = ARGV[2] == 'c'
for j = 1, n do
  local shadow = ARGV[p + (j - 1) * 6 + 5] == '1'
  if not decisions[j][1] and not shadow then admitted = false end
end

for j = 1, n do
  local d = decisions[j]
  if admitted and d[1] then commits[j]() end
  local flag = 0
  if d[1] then flag = 1 end
  reply[#reply + 1] = flag
  for f = 2, 6 do reply[#reply + 1] = d[f] end
end

k = k + n
p = p + 6 * n
end
return reply
