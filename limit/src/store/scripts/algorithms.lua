-- algorithms.lua: one table per algorithm, the only place the library knows what an algorithm
-- does; after state.lua, before the modes (runs.lua, decide.lua, quota.lua) that use them.
-- The same arithmetic as src/limiter/ (algorithm.rs, charge.rs, lease.rs, refund.rs, adjust.rs),
-- line for line; the differential tests hold the two to it. Every number stays below 2^53, so
-- Lua's doubles are exact.
--
-- A definition is (L, P, B, C): the limit, the period in µs, the burst, the cost. A cw
-- (calendar window) definition arrives with P its calendar code and B 0; the modes turn them
-- into the window at `now` (state.lua cal_window) before any of this runs: B its start, P its
-- end. A state is (a, b, c) as stored (state.lua); `nil` when the key is missing.
--
-- Every table has:
--   at(L, P, B, now, a, b, c)     the state at `now`, the view every other function decides on
--                                 (a window's count in the current window, a bucket's level, a
--                                 TAT's base); internal to the table's functions
--   decide(L, P, B, C, now, a, b, c)
--                                 one request costing C: allowed (true|false), limit, remaining,
--                                 retry_after µs, reset_after µs, delay µs; writes nothing
--   charge(L, P, B, C, now, a, b, c, m, lease)
--                                 the state after m requests costing C are charged (`lease`: a
--                                 concurrency limit's lease id)
--   force(L, P, B, u, now, a, b, c, lease)
--                                 the state after a charge of u units after the response,
--                                 whatever is left (clamped to a spent limit), or a concurrency
--                                 lease released
--   load(key, P, now), write(key, L, P, B, now, a, b, c, kept, ttls)
--                                 reading and writing the key (one string; a sorted set for sl
--                                 and cc)
-- and, for the algorithms that have them (nil otherwise):
--   read(v), expiry(L, P, B, a, b, c), kept(L, P, B, a, b, c)
--                                 a string state from a GET/MGET value; when the key holding
--                                 this state may expire (µs); the expiry a key read with this
--                                 state already has (nil when not known; expiry's for a state
--                                 read, but for cw's from another window)
--   capacity(L, P, B, C, now, a, b, c, k)
--                                 how many of a run of k requests costing C, all at `now`, the
--                                 limit admits (runs.lua: request i is admitted while
--                                 i × step <= room, so a run's outcome is monotone)
--   avail(L, P, B, now, a, b), give_back(L, P, B, u, now, a, b, c)
--                                 leases: the units the limit could admit at once; the state
--                                 after u unused leased units go back (fw, cw, tb, gcra)
--   grant(L, P, B, u, now, a, b, c)
--                                 support's grant of u units now, beyond the quota as credit
--                                 (quota.lua; not sl, cc)
--
-- Credit (after a grant beyond the quota) lapses on its own: a fw/cw count or sw curr below 0
-- (until the window ends; a sw window that ended in credit weighs as 0 in the next); a tb level
-- above B·P (no refill adds to it; it lapses, the bucket full, a period after `last`); a gcra/lb
-- credit in µs (a request counts from max(TAT, now) − credit; with a credit the TAT is when it
-- was written, and it lapses a period later).

local function max(a, b) if a > b then return a end return b end
local function min(a, b) if a < b then return a end return b end
local function ceil_div(a, b) if b == 0 then return 0 end return floor((a + b - 1) / b) end
-- GCRA's emission interval: P / L µs, at least 1 (written out where a run's hot path needs it:
-- `(P - P % L) / L`, then 1 if below).
local function emission(L, P)
  local T = (P - P % L) / L
  if T < 1 then return 1 end
  return T
end
-- How many of a run of k requests fit in `room` at `step` each: request i is admitted while
-- i × step <= room (a run's capacity, for every algorithm that has one).
local function fit(room, step, k)
  if room < step then return 0 end
  local n = (room - room % step) / step
  if n > k then return k end
  return n
end
-- A bucket key's expiry is rounded up to the period's grid, floor(needed / P) + 1 periods
-- (`needed - needed % P + P`), so that the many writes of one period give one expiry, set once
-- and kept (`SET … KEEPTTL`) by the others. At most one period later than needed.

-- A string state's key: read, and written once per call with its TTL (state.lua).
local function load_string(A)
  return function(key) return A.read(redis.call('GET', key)) end
end
local function write_string(A)
  return function(key, L, P, B, now, a, b, c, kept, ttls)
    state_write(key, A, L, P, B, now, a, b, c, kept, ttls)
  end
end
local function kept_of(A)
  return function(L, P, B, a, b, c)
    if not a then return nil end
    return A.expiry(L, P, B, a, b, c)
  end
end

-- fw and cw: a count per window. `window(P, B, now)` is the window containing `now` and its end.
local function windowed(alg, window)
  local A = {read = read2, pack = pack2}
  function A.at(L, P, B, now, a, b)
    local w, wend = window(P, B, now)
    if a == w then return w, wend, b end
    return w, wend, 0
  end
  function A.decide(L, P, B, C, now, a, b)
    local _, wend, count = A.at(L, P, B, now, a, b)
    local reset = max(wend - now, 0)
    if count + C <= L then return true, L, max(L - count - C, 0), 0, reset, 0 end
    return false, L, max(L - count, 0), reset, reset, 0
  end
  function A.capacity(L, P, B, C, now, a, b, c, k)
    local _, _, count = A.at(L, P, B, now, a, b)
    local room = L - count
    return fit(room, C, k)
  end
  function A.charge(L, P, B, C, now, a, b, c, m)
    local w, _, count = A.at(L, P, B, now, a, b)
    return w, count + m * C
  end
  function A.force(L, P, B, u, now, a, b)
    local w, _, count = A.at(L, P, B, now, a, b)
    return w, min(count + min(u, L), L)
  end
  function A.avail(L, P, B, now, a, b)
    local _, _, count = A.at(L, P, B, now, a, b)
    if count > L then return 0 end
    return L - count
  end
  -- From the current window's count only, below 0 down to the credit bound.
  function A.give_back(L, P, B, u, now, a, b, c)
    local w = window(P, B, now)
    if a == w then b = max(b - u, -credit_max(alg, L, P, B)) end
    return a, b, c
  end
  function A.grant(L, P, B, u, now, a, b)
    local w, _, count = A.at(L, P, B, now, a, b)
    return w, max(count - u, -credit_max(alg, L, P, B))
  end
  A.load, A.write = load_string(A), write_string(A)
  return A
end

local fw = windowed('fw', function(P, B, now)
  local w = (now - now % P) / P
  return w, (w + 1) * P
end)
function fw.expiry(L, P, B, a) return (a + 1) * P end
fw.kept = kept_of(fw)

local cw = windowed('cw', function(P, B, now) return B, P end)
function cw.expiry(L, P) return P end
-- A key read in another calendar window: its expiry (that window's end) is not P.
function cw.kept(L, P, B, a)
  if not a or a ~= B then return nil end
  return P
end

-- sw: the current window's count and the previous one's, weighted by what is left of it.
local sw = {read = read3, pack = pack3}
function sw.at(L, P, B, now, a, b, c)
  local elapsed = now % P
  local w = (now - elapsed) / P
  local curr, prev = 0, 0
  if a == w then curr, prev = b, c
  elseif a and a + 1 == w and b > 0 then prev = b end -- credit lapsed with its window
  return w, elapsed, curr, prev
end
function sw.decide(L, P, B, C, now, a, b, c)
  local _, elapsed, curr, prev = sw.at(L, P, B, now, a, b, c)
  local weighted = prev * (P - elapsed) + curr * P
  local ok = weighted + C * P <= L * P
  local used, retry, reset = weighted, 0, 0
  if ok then used = used + C * P end
  local remaining = floor(max(L * P - used, 0) / P)
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
  return ok, L, remaining, retry, reset, 0
end
function sw.capacity(L, P, B, C, now, a, b, c, k)
  local _, elapsed, curr, prev = sw.at(L, P, B, now, a, b, c)
  -- weighted + C·P <= L·P, weighted growing by C·P per admitted request.
  local room, step = L * P - (prev * (P - elapsed) + curr * P), C * P
  return fit(room, step, k)
end
function sw.charge(L, P, B, C, now, a, b, c, m)
  local w, _, curr, prev = sw.at(L, P, B, now, a, b, c)
  return w, curr + m * C, prev
end
function sw.force(L, P, B, u, now, a, b, c)
  local w, _, curr, prev = sw.at(L, P, B, now, a, b, c)
  return w, min(curr + min(u, L), L), prev
end
function sw.grant(L, P, B, u, now, a, b, c)
  local w, _, curr, prev = sw.at(L, P, B, now, a, b, c)
  return w, max(curr - u, -credit_max('sw', L, P, B)), prev
end
function sw.expiry(L, P, B, a) return (a + 2) * P end
sw.kept = kept_of(sw)
sw.load, sw.write = load_string(sw), write_string(sw)

-- tb: a level in tokens × P, refilled at L per µs since `last`, at most B·P; full when there
-- is no state. Granted tokens above B·P are kept as they are (refill stops at the burst and
-- never cuts them) until a period passes without a request.
local tb = {read = read2, pack = pack2}
function tb.at(L, P, B, now, level, last)
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
function tb.decide(L, P, B, C, now, a, b)
  local full = B * P
  local level = tb.at(L, P, B, now, a, b)
  local need = C * P
  local ok = level >= need
  local after, retry, reset = level, 0, 0
  if ok then after = level - need else retry = ceil_div(need - level, L) end
  -- Granted tokens above the burst lapse a period after this request.
  if after > full then reset = P else reset = ceil_div(full - after, L) end
  return ok, B, floor(after / P), retry, reset, 0
end
function tb.capacity(L, P, B, C, now, a, b, c, k)
  local room, step = tb.at(L, P, B, now, a, b), C * P
  return fit(room, step, k)
end
function tb.charge(L, P, B, C, now, a, b, c, m)
  return tb.at(L, P, B, now, a, b) - m * C * P, now
end
function tb.force(L, P, B, u, now, a, b)
  return max(tb.at(L, P, B, now, a, b) - min(u, B) * P, 0), now
end
function tb.avail(L, P, B, now, a, b)
  return floor(tb.at(L, P, B, now, a, b) / P)
end
-- Up to a full bucket, or up to the credit bound for a bucket holding granted tokens.
function tb.give_back(L, P, B, u, now, a, b, c)
  local cap = B * P
  if a > cap then cap = (B + credit_max('tb', L, P, B)) * P end
  return min(a + u * P, cap), b, c
end
function tb.grant(L, P, B, u, now, a, b)
  return min(tb.at(L, P, B, now, a, b) + u * P, (B + credit_max('tb', L, P, B)) * P), now
end
function tb.expiry(L, P, B, a, b)
  local needed = b + P
  if a <= B * P then
    local x = B * P - a + L - 1
    needed = b + (x - x % L) / L
  end
  return needed - needed % P + P
end
tb.kept = kept_of(tb)
tb.load, tb.write = load_string(tb), write_string(tb)

-- gcra and lb: a TAT (theoretical arrival time). A TAT before `now` is kept as credit relative
-- to now (the state (now, now − TAT)); it lapses a period after it was written.
local function tat_state(tat, now)
  if tat < now then return now, now - tat end
  return tat, 0
end
local function tat(alg, quota, decide)
  local A = {read = read_tat, pack = pack_tat, decide = decide}
  -- Where a request at `now` counts from (src/limiter/algorithm.rs tat_base): max(TAT, now),
  -- less the granted credit while it lives; `now` when there is no state.
  function A.at(L, P, B, now, a, b)
    if not a then return now end
    local base = a
    if base < now then base = now end
    if b and b > 0 and now - a < P then base = base - b end
    return base
  end
  function A.capacity(L, P, B, C, now, a, b, c, k)
    local T = (P - P % L) / L
    if T < 1 then T = 1 end
    local step = C * T
    -- gcra: base + i·C·T − now <= B·T; lb: the i-th waits base − now + (i − 1)·C·T <= B·T
    local room = B * T - (A.at(L, P, B, now, a, b) - now)
    if alg == 'lb' then
      -- more than the queue's places (B + 1) never fits (decide below)
      if C > B + 1 then return 0 end
      room = room + step
    end
    return fit(room, step, k)
  end
  function A.charge(L, P, B, C, now, a, b, c, m)
    local T = (P - P % L) / L
    if T < 1 then T = 1 end
    local tat = A.at(L, P, B, now, a, b) + m * C * T
    if tat < now then return now, now - tat end
    return tat, 0
  end
  function A.force(L, P, B, u, now, a, b)
    local T = emission(L, P)
    return tat_state(min(A.at(L, P, B, now, a, b) + min(u, quota(L, B)) * T, now + B * T), now)
  end
  function A.grant(L, P, B, u, now, a, b)
    local T = emission(L, P)
    return tat_state(max(A.at(L, P, B, now, a, b) - u * T, now - credit_max(alg, L, P, B) * T), now)
  end
  function A.expiry(L, P, B, a, b)
    local needed = a
    if b and b > 0 then needed = a + P end
    return needed - needed % P + P
  end
  A.kept = kept_of(A)
  A.load, A.write = load_string(A), write_string(A)
  return A
end

-- (declared first: their decide functions name them)
local gcra, lb
gcra = tat('gcra', function(L, B) return B end, function(L, P, B, C, now, a, b)
  local T = emission(L, P)
  local base = gcra.at(L, P, B, now, a, b)
  local new_tat, tolerance = base + C * T, B * T
  local ok = new_tat - now <= tolerance
  local after, retry = base, 0
  if ok then after = new_tat else retry = new_tat - now - tolerance end
  local reset = after - now
  if reset < 0 then reset = P end
  return ok, B, floor(max(tolerance - (after - now), 0) / T), retry, reset, 0
end)
-- A lease's units: the tolerance left, in emission intervals.
function gcra.avail(L, P, B, now, a, b)
  local T = emission(L, P)
  local left = B * T - (gcra.at(L, P, B, now, a, b) - now)
  if left < 0 then return 0 end
  return floor(left / T)
end
-- A TAT still ahead of `now` moves back by u emission intervals, never below `now`; a credit
-- grows by them up to the bound.
function gcra.give_back(L, P, B, u, now, a, b, c)
  local T = emission(L, P)
  if a > now then return max(a - u * T, now), b, c end
  if b and b > 0 then return a, min(b + u * T, credit_max('gcra', L, P, B) * T), c end
  return a, b, c
end

-- The leaky bucket: GCRA whose admitted requests wait their turn (delay) instead of bursting.
lb = tat('lb', function(L) return L end, function(L, P, B, C, now, a, b)
  local T = emission(L, P)
  local base = lb.at(L, P, B, now, a, b)
  local max_wait, wait = B * T, base - now
  -- a cost above the queue's places (B + 1) never fits (leaky_bucket.rs decide)
  local excess = max(C - (B + 1), 0)
  local ok = excess == 0 and wait <= max_wait
  local after, retry, delay, remaining = base, 0, 0, 0
  if ok then
    after = base + C * T
    delay = max(wait, 0) -- a slot before now (credit) goes at once
  elseif excess > 0 then
    retry = max(wait, 0) + excess * T
  else
    retry = wait - max_wait
  end
  local next_wait = after - now
  if next_wait <= max_wait then remaining = floor((max_wait - next_wait) / T) + 1 end
  local reset = next_wait
  if reset < 0 then reset = P end
  return ok, B + 1, remaining, retry, reset, delay
end)

-- sl: a sorted set of "ts:cost:seq" members scored by ts, never more than L entries. The state
-- is (sum, log, nil): the costs' sum within the period and {ts, costs, adds}, the entries in
-- time order and the costs this call adds.
local sl = {}
function sl.load(key, P, now)
  local items = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', now - P), '+inf', 'WITHSCORES')
  local ts, costs, sum = {}, {}, 0
  for i = 1, #items, 2 do
    local c = tonumber(string.match(items[i], '^%-?%d+:(%d+):'))
    ts[#ts + 1] = tonumber(items[i + 1])
    costs[#costs + 1] = c
    sum = sum + c
  end
  return sum, {ts = ts, costs = costs, adds = {}}
end
function sl.decide(L, P, B, C, now, sum, log)
  if sum + C <= L then return true, L, max(L - sum - C, 0), 0, P, 0 end
  local ts, costs = log.ts, log.costs
  local retry, reset, freed = P, 0, 0
  for i = 1, #ts do
    freed = freed + costs[i]
    if sum - freed + C <= L then retry = ts[i] + P - now; break end
  end
  if #ts > 0 then reset = ts[#ts] + P - now end
  return false, L, max(L - sum, 0), retry, reset, 0
end
-- An entry of u units at `now`, kept in time order (a clock that stepped back leaves later
-- entries).
local function sl_add(now, sum, log, u)
  local ts, costs = log.ts, log.costs
  local i = #ts + 1
  while i > 1 and ts[i - 1] > now do
    ts[i], costs[i] = ts[i - 1], costs[i - 1]
    i = i - 1
  end
  ts[i], costs[i] = now, u
  log.adds[#log.adds + 1] = u
  return sum + u, log
end
function sl.charge(L, P, B, C, now, sum, log) return sl_add(now, sum, log, C) end
function sl.force(L, P, B, u, now, sum, log)
  u = min(u, L - sum)
  if u > 0 then return sl_add(now, sum, log, u) end
  return sum, log
end
function sl.write(key, L, P, B, now, sum, log)
  local fmt = string.format
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', now - P))
  local seq = redis.call('ZCARD', key)
  local args = {}
  local t = fmt('%d', now)
  for i, c in ipairs(log.adds) do
    args[#args + 1] = t
    args[#args + 1] = t .. ':' .. fmt('%d', c) .. ':' .. fmt('%d', seq + i - 1)
  end
  if #args > 0 then redis.call('ZADD', key, unpack(args)) end
  redis.call('PEXPIRE', key, max(ceil_div(P, 1000), 1))
end

-- cc (concurrency): a sorted set of lease ids (a number unique per request) scored by their
-- expiry in µs: a lease lives `period` unless the request releases it first, so a gateway that
-- died leaks no slot for longer. Expired leases are purged whenever the key is written and
-- never counted. The state is (count, adds, rems): live leases, ids to add and to release.
local cc = {}
function cc.load(key, P, now)
  return redis.call('ZCOUNT', key, '(' .. string.format('%d', now), '+inf'), {}, {}
end
function cc.decide(L, P, B, C, now, count)
  if count + C <= L then return true, L, L - count - C, 0, 0, 0 end
  return false, L, max(L - count, 0), 1000000, 0, 0
end
function cc.charge(L, P, B, C, now, count, adds, rems, m, lease)
  adds[#adds + 1] = lease
  return count + C, adds, rems
end
function cc.force(L, P, B, u, now, count, adds, rems, lease)
  rems[#rems + 1] = lease
  return count, adds, rems
end
function cc.write(key, L, P, B, now, count, adds, rems)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
  if #adds > 0 then
    local args = {}
    local exp = string.format('%d', now + P)
    for i, id in ipairs(adds) do
      args[2 * i - 1], args[2 * i] = exp, id
    end
    redis.call('ZADD', key, unpack(args))
  end
  if #rems > 0 then redis.call('ZREM', key, unpack(rems)) end
  if redis.call('ZCARD', key) > 0 then
    redis.call('PEXPIRE', key, max(floor((P + 999) / 1000), 1))
  end
end

-- The tables by the code the gateway sends (src/store/redis/keys.rs ScriptAlgorithm).
local ALGORITHMS = {fw = fw, cw = cw, sw = sw, tb = tb, gcra = gcra, lb = lb, sl = sl, cc = cc}
