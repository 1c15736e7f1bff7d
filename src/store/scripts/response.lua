-- response.lua: helpers of the limits that look at the response, prepended to decide.lua (one
-- script: src/store/redis/script.rs SOURCE). Pure functions of their arguments, plus the lease
-- commands of a concurrency key; decide.lua calls them.
--
-- Charge after the response (mode 'f', `Store::settle`): the amount is added whatever is left,
-- clamped to the quota, and the state is clamped to a spent limit (the same arithmetic as
-- src/limiter/charge.rs `force`): fw count <= L, sw curr <= L, tb level >= 0, gcra
-- TAT <= now + B*T (sl is clamped in decide.lua, where its entries are).
--
-- Concurrency keys (<prefix>:{<route>:<limit>:<subject-hash>}:cc) are sorted sets of lease ids
-- (a number unique per request) scored by their expiry in µs: a lease lives `period` unless the
-- request releases it first, so a gateway that died leaks no slot for longer. Expired leases
-- are purged whenever the key is written and never counted.

-- fw/cw/sw/tb/gcra state (s1, s2, s3 as decide.lua keeps it) after a forced charge of u units.
local function force_state(alg, L, P, B, u, now, a, b, c)
  local quota = L
  if alg == 'tb' or alg == 'gcra' then quota = B end
  if u > quota then u = quota end
  if alg == 'fw' or alg == 'cw' then
    -- cw: the calendar window's start is B (decide.lua's definitions).
    local w = B
    if alg == 'fw' then w = math.floor(now / P) end
    local count = 0
    if a == w then count = b end
    count = count + u
    if count > L then count = L end
    return w, count, nil
  elseif alg == 'sw' then
    local w = math.floor(now / P)
    local curr, prev = 0, 0
    if a == w then curr, prev = b, c elseif a and a + 1 == w and b > 0 then prev = b end
    curr = curr + u
    if curr > L then curr = L end
    return w, curr, prev
  elseif alg == 'tb' then
    local level = tb_level(L, P, B, now, a, b) - u * P
    if level < 0 then level = 0 end
    return level, now, nil
  else -- gcra: a TAT before now (granted credit left) is kept as credit
    local T = math.floor(P / L)
    if T < 1 then T = 1 end
    local tat = tat_base(P, now, a, b) + u * T
    if tat > now + B * T then tat = now + B * T end
    if tat < now then return now, now - tat, nil end
    return tat, 0, nil
  end
end

-- Live leases of a concurrency key (read-only: also in evaluate mode).
local function cc_count(key, now)
  return redis.call('ZCOUNT', key, '(' .. string.format('%d', now), '+inf')
end

-- Purges expired leases, adds and removes lease ids, and keeps the key while it holds any.
local function cc_write(key, now, P, adds, rems)
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
    redis.call('PEXPIRE', key, math.max(math.floor((P + 999) / 1000), 1))
  end
end

