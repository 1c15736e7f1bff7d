-- quota.lua: support's corrections to one limit's state for one subject (the admin API's
-- POST /-/quota/reset and /-/quota/grant), in one atomic step: the key is read, changed and
-- written with nothing in between, so a correction racing requests loses none of their charges
-- and they lose none of it. main.lua sends argv[2] 'reset' and 'grant' here; each
-- algorithm's `grant` (algorithms.lua) is the same arithmetic as src/limiter/adjust.rs.
--
-- keys[1]  the state key: <prefix>:{<scope>:<limit>:<subject-hash>}:<alg>
-- argv[1]  '' to use Redis TIME, or the time in microseconds since the epoch (an injected clock)
-- argv[2]  'reset' (the state and its generation <key>:g are deleted: the limit is fresh) or
--          'grant'
-- argv[3]  the algorithm: fw, cw, sw, sl, tb, gcra, lb (cw: P is the calendar unit, 1 day,
--          2 week, 3 month, as decide.lua takes it)
-- argv[4]  L, ARGV[5] P (µs), ARGV[6] B
-- argv[7]  the units granted (grant only; the gateway bounds them by the limit's quota)
-- Reply    1 when there was state to change (always for a grant), 0 when a reset found the limit
--          already fresh for the subject
--
-- The penalty box shared through the store (`ban_after`, decide.lua's 'b' flag), argv[3…]:
-- 'ban'      keys[1] the ban <state key>:b; argv[3] its end (µs, the gateway's clock), argv[4] its
--            TTL (ms): SET. Reply 1.
-- 'unban'    keys[1] a ban: DEL. Reply 1 when there was one.
-- 'banlist'  keys[1] the limit's index of bans <prefix>:{<scope>:<limit>}:bans (a sorted set,
--            subject hash by end); argv[3] a subject's hash, argv[4] its ban's end, argv[5] the
--            TTL (ms): ZADD, the index kept as long as its longest ban. Reply 1.
-- 'banlift'  keys[1] the index: deleted, its count of lifts <index>:n incremented (gateways that
--            cached a ban watch it). Reply: the subjects' hashes, concatenated (a bulk string).
-- 'banlifts' keys[1] the index: its count of lifts (0 when none).
--
-- A grant gives `units` more requests now, beyond a fresh limit if need be (credit, state.lua:
-- it lapses on its own): a fixed or calendar window's count in the current window goes down,
-- below 0 if need be (an earlier window's count no longer counts: the current one starts at
-- -units); a sliding window's current count likewise (a window that ended in credit weighs as 0
-- in the next); a token bucket gains the tokens, above its burst if need be; GCRA's and the
-- leaky bucket's TAT moves back by units × T, the part before now kept as credit. The credit is
-- at most credit_max units (state.lua). sl and cc are refused by the gateway.

local function bans(keys, argv)
  local key, mode = keys[1], argv[2]
  if mode == 'ban' then
    redis.call('SET', key, argv[3], 'PX', argv[4])
    return 1
  elseif mode == 'unban' then
    return redis.call('DEL', key)
  elseif mode == 'banlist' then
    redis.call('ZADD', key, argv[4], argv[3])
    local ttl = tonumber(argv[5])
    if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
    return 1
  elseif mode == 'banlift' then
    local subjects = redis.call('ZRANGE', key, 0, -1)
    redis.call('DEL', key)
    redis.call('INCR', key .. ':n')
    return table.concat(subjects)
  end
  return tonumber(redis.call('GET', key .. ':n')) or 0
end

local function quota(keys, argv)
  local key = keys[1]
  if argv[2] == 'reset' then
    -- The state's generation goes with it: a lease of the old state is never given back into
    -- the fresh one (decide.lua).
    local had = redis.call('DEL', key)
    redis.call('DEL', key .. ':g')
    return had
  end
  local now = clock(argv[1])
  local alg = argv[3]
  local A = ALGORITHMS[alg]
  if not A or not A.grant then
    return redis.error_reply('quota.lua: cannot grant on algorithm ' .. tostring(alg))
  end
  local L, P, B = tonumber(argv[4]), tonumber(argv[5]), tonumber(argv[6])
  local units = tonumber(argv[7]) or 0
  if alg == 'cw' then
    -- The calendar unit (P) becomes the window at `now`, as decide.lua's definitions: B its
    -- start, P its end.
    B, P = cal_window(P, now)
  end
  local a, b, c = A.read(redis.call('GET', key))
  a, b, c = A.grant(L, P, B, units, now, a, b, c)
  state_write(key, A, L, P, B, now, a, b, c)
  return 1
end
