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
-- Reply    1 when there was state to change, 0 when the limit was already fresh for the subject
--
-- A grant gives back units used, never more than was used: a fixed or calendar window's count
-- in the current window goes down (not below 0); a sliding window's current count, then its
-- previous one; a token bucket gains the tokens (up to its burst); GCRA's and the leaky bucket's
-- TAT moves back by units × T (not before now). sl and cc are refused by the gateway.

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

local existed = redis.call('EXISTS', key) == 1
if mode == 'reset' then
  if existed then redis.call('DEL', key) end
  if existed then return 1 end
  return 0
end
if not existed then return 0 end

local a, b, c = state_read(redis.call('GET', key), alg)
if alg == 'fw' or alg == 'cw' then
  local w, p = floor(now / P), P
  if alg == 'cw' then
    local start, stop = cal_window(P, now)
    w, p = start, stop
  end
  if a ~= w then return 0 end
  local count = b - units
  if count < 0 then count = 0 end
  state_write(key, alg, L, p, B, now, w, count)
elseif alg == 'sw' then
  local w = floor(now / P)
  local curr, prev = 0, 0
  if a == w then curr, prev = b, c elseif a + 1 == w then curr, prev = 0, b end
  local take = units
  if take > curr then take = curr end
  curr = curr - take
  local rest = units - take
  if rest > prev then rest = prev end
  prev = prev - rest
  state_write(key, alg, L, P, B, now, w, curr, prev)
elseif alg == 'tb' then
  local level = tb_level(L, P, B, now, a, b) + units * P
  if level > B * P then level = B * P end
  state_write(key, alg, L, P, B, now, level, now)
elseif alg == 'gcra' or alg == 'lb' then
  local T = floor(P / L)
  if T < 1 then T = 1 end
  local tat = a - units * T
  if tat <= now then
    redis.call('DEL', key)
  else
    state_write(key, alg, L, P, B, now, tat)
  end
else
  return redis.error_reply('quota.lua: cannot grant on algorithm ' .. tostring(alg))
end
return 1
