-- quota.lua: support's corrections to one limit's state for one subject (the admin API's
-- POST /-/quota/reset and /-/quota/grant), in one atomic step: the key is read, changed and
-- written with nothing in between, so a correction racing requests loses none of their charges
-- and they lose none of it. Runs after state.lua (src/store/redis/quota.rs SOURCE). The same
-- arithmetic as src/limiter/adjust.rs, line for line.
--
-- KEYS[1]  the state key: <prefix>:{<scope>:<limit>:<subject-hash>}:<alg>
-- ARGV[1]  '' to use Redis TIME, or the time in microseconds since the epoch (an injected clock)
-- ARGV[2]  'reset' (the state is deleted: the limit is fresh) or 'grant'
-- ARGV[3]  the algorithm: fw, cw, sw, sl, tb, gcra, lb (cw: P is the calendar unit, 1 day,
--          2 week, 3 month, as decide.lua takes it)
-- ARGV[4]  L, ARGV[5] P (µs), ARGV[6] B
-- ARGV[7]  the units granted (grant only; the gateway bounds them by the limit's quota)
-- Reply    1 when there was state to change (always for a grant), 0 when a reset found the limit
--          already fresh for the subject
--
-- A grant gives `units` more requests now, beyond a fresh limit if need be (credit, state.lua:
-- it lapses on its own): a fixed or calendar window's count in the current window goes down,
-- below 0 if need be (an earlier window's count no longer counts: the current one starts at
-- -units); a sliding window's current count likewise (a window that ended in credit weighs as 0
-- in the next); a token bucket gains the tokens, above its burst if need be; GCRA's and the
-- leaky bucket's TAT moves back by units × T, the part before now kept as credit. The credit is
-- at most credit_max units (state.lua). sl and cc are refused by the gateway.

local key = KEYS[1]
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local mode, alg = ARGV[2], ARGV[3]
local L, P, B = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local units = tonumber(ARGV[7]) or 0
local floor = math.floor

if mode == 'reset' then
  return redis.call('DEL', key)
end

local a, b, c = state_read(redis.call('GET', key), alg)
local most = credit_max(alg, L, P, B)
if alg == 'fw' or alg == 'cw' then
  local w, p = floor(now / P), P
  if alg == 'cw' then
    local start, stop = cal_window(P, now)
    w, p = start, stop
  end
  local count = 0
  if a == w then count = b end
  count = count - units
  if count < -most then count = -most end
  state_write(key, alg, L, p, B, now, w, count)
elseif alg == 'sw' then
  local w = floor(now / P)
  local curr, prev = 0, 0
  if a == w then curr, prev = b, c elseif a and a + 1 == w and b > 0 then prev = b end
  curr = curr - units
  if curr < -most then curr = -most end
  state_write(key, alg, L, P, B, now, w, curr, prev)
elseif alg == 'tb' then
  local level = tb_level(L, P, B, now, a, b) + units * P
  if level > (B + most) * P then level = (B + most) * P end
  state_write(key, alg, L, P, B, now, level, now)
elseif alg == 'gcra' or alg == 'lb' then
  local T = floor(P / L)
  if T < 1 then T = 1 end
  local tat = tat_base(P, now, a, b) - units * T
  if tat < now - most * T then tat = now - most * T end
  if tat < now then
    state_write(key, alg, L, P, B, now, now, now - tat)
  else
    state_write(key, alg, L, P, B, now, tat, 0)
  end
else
  return redis.error_reply('quota.lua: cannot grant on algorithm ' .. tostring(alg))
end
return 1
