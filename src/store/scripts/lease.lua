-- lease.lua: leases (`sync = "lease"`), prepended to decide.lua (one script:
-- src/store/redis/script.rs SOURCE, after state.lua and response.lua). The same arithmetic as
-- src/limiter/lease.rs (what a lease can get) and src/limiter/refund.rs (giving units back).
--
-- A definition whose flags carry `l<N>` is a lease of up to N units: decide.lua decides it as one
-- request whose cost is what it gets, min(N, lease_avail(...)) rounded down to a multiple of C,
-- and denies it (charging nothing)
-- when fewer than C units are available. Its reply's sixth integer (delay, 0 for these
-- algorithms otherwise) is the number of units granted. A definition with flags `r` in mode 'f'
-- gives C unused units back (return_state). Only fw, cw, tb and gcra lease (the config refuses
-- the others).
--
-- KEYS, ARGV and the reply: decide.lua's.

-- The units the limit could admit at once at `now` (fw/cw: the window's count left; tb: whole
-- tokens; gcra: the tolerance left, in emission intervals). s1, s2: decide.lua's state.
local function lease_avail(alg, L, P, B, now, a, b)
  if alg == 'fw' or alg == 'cw' then
    local w = B
    if alg == 'fw' then w = math.floor(now / P) end
    local count = 0
    if a == w then count = b end
    if count > L then return 0 end
    return L - count
  elseif alg == 'tb' then
    return math.floor(tb_level(L, P, B, now, a, b) / P)
  elseif alg == 'gcra' then
    local T = math.floor(P / L)
    if T < 1 then T = 1 end
    local left = B * T - (tat_base(P, now, a, b) - now)
    if left < 0 then return 0 end
    return math.floor(left / T)
  end
  return 0
end

-- The state after giving back u units at `now` (src/limiter/refund.rs with charged_at = now):
-- fw/cw from the count of the current window only (below 0 down to the credit bound:
-- state.lua credit_max); tb tokens up to a full bucket, or up to the credit bound for a bucket
-- holding granted tokens; a gcra TAT still ahead of `now` moves back by u emission intervals,
-- never below `now`, and a gcra credit grows by them up to the bound.
local function return_state(alg, L, P, B, u, now, a, b, c)
  if alg == 'fw' or alg == 'cw' then
    local w = B
    if alg == 'fw' then w = math.floor(now / P) end
    if a == w then
      local most = credit_max(alg, L, P, B)
      b = b - u
      if b < -most then b = -most end
    end
    return a, b, c
  elseif alg == 'tb' then
    local cap = B * P
    if a > cap then cap = (B + credit_max(alg, L, P, B)) * P end
    local level = a + u * P
    if level > cap then level = cap end
    return level, b, c
  elseif alg == 'gcra' then
    local T = math.floor(P / L)
    if T < 1 then T = 1 end
    if a > now then
      local tat = a - u * T
      if tat < now then tat = now end
      return tat, b, c
    elseif b and b > 0 then
      local most = credit_max(alg, L, P, B) * T
      b = b + u * T
      if b > most then b = most end
      return a, b, c
    end
  end
  return a, b, c
end
