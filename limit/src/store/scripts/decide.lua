-- decide.lua: decides every limit of a batch of requests, each request all-or-nothing, in one
-- atomic step (modes 'c' and 'e'), or settles what answered requests owe (mode 'f'). Requests
-- are decided in order; a later one sees what an earlier one charged. What each algorithm does
-- is its table's (algorithms.lua); this is the batch around it.
--
-- Coalesced by key: a key is read once per batch (at its first use), every decision on it runs
-- on its state in the script's memory, and it is written once at the end (only when a request
-- charged it). A `global` limit or a busy API key costs one GET and one SET per batch, however
-- many of the batch's requests it decides.
--
-- A Lua script rather than MULTI/EXEC: a decision must read before it writes, and a key can
-- change or expire between MULTI's commands; the script runs with nothing in between.
--
-- keys      the batch's distinct state keys: <prefix>:{<route>:<limit>:<subject-hash>}:<alg>.
-- argv[1]   '' to use Redis TIME, or the time in microseconds since the epoch (an injected clock)
-- argv[2]   'c' to decide and charge ('r': the same, the batch sent as runs: runs.lua); 'e' to
--           evaluate only, writing nothing (the first phase of a Redis Cluster decision whose
--           limits span several slots); 'f' to settle what answered requests owe: charge C
--           whatever is left (clamped to a spent limit), give leased units back, or release a
--           cc lease — never denied, replying 1 for each
-- argv[3]   D, the number of limit definitions; then D definitions of 6 arguments:
--           algorithm (fw|sw|sl|tb|gcra|lb|cw|cc), L, P (µs), B, C, flags: shadow (1|0), then
--           'a' for a limit charged after the response (evaluated, never charged by 'c'), or
--           'l<N>' for a lease of up to N units (its reply's delay is the units granted, its
--           retry_after the generation of the state it was charged to), optionally followed by
--           'd<T>': granted only while Redis TIME is before T (µs, on Redis's clock whatever
--           argv[1] says), or 'r' (mode 'f') to give C units back ('r<G>': leased units of
--           generation G, given back only into that generation); a final 'b': the limit has a
--           penalty box (`ban_after`) shared through the store: in modes 'c' and 'e' its key's
--           ban <key>:b (the same hash tag; quota.lua 'ban' writes it) is read, and while it
--           holds a time after `now` the limit refuses, charging nothing: the reply's
--           retry_after and reset_after are the ban's time left, remaining 0, and delay -1
--           (which no other reply has) marks it banned. cw is a fixed window aligned to the UTC
--           calendar: P is its unit (1 day, 2 week, 3 month) and B is 0; the script turns them
--           into the window containing `now` (state.lua cal_window): P its end and B its start
--           (µs). Its state is fw's, with the start as the window.
-- then      R, the number of requests; then for each request: its number of limits n, and for
--           each limit: its definition's index (1-based) and its key's index in keys, and for a
--           cc limit its lease id ('0' in mode 'c': evaluate, take no slot).
-- Reply     6 integers per limit of every request, in order: allowed (1|0), limit, remaining,
--           retry_after µs, reset_after µs, delay µs. A request charges only when every
--           non-shadow limit of it admits it, and then only the limits that admitted it. Every
--           written key gets a TTL that ends when its state no longer matters.
--
-- Leases (`sync = "lease"`, the same arithmetic as src/limiter/lease.rs and refund.rs): a
-- definition whose flags carry `l<N>` is decided as one request whose cost is what it gets,
-- min(N, the algorithm's `avail`) rounded down to a multiple of C, and denied (charging
-- nothing) when fewer than C units are available; its reply's delay is the units granted.
-- Only fw, cw, tb and gcra lease (the config refuses the others).
--
-- A lease belongs to one generation of its key's state: the key <key>:g (the same hash tag,
-- so the same Cluster slot) holds a number made from Redis TIME when a lease is first granted
-- from that state, with the state's TTL; a reset deletes it (quota.lua) and so does FLUSHALL
-- or an expiry. The grant's reply carries it (retry_after, 0 for a request), the gateway's
-- return names it ('r<G>'), and units of another generation are never given back into this
-- one. A lease past its deadline ('d<T>': the gateway gave up on the call) is granted nothing
-- and its request charges nothing: its reply is all zeros (limit 0, which no real limit has),
-- which a gateway still waiting reads as a timeout.

local function decide(keys, argv)
  local now = clock(argv[1])

  -- Limit definitions: the algorithm's table, L, P, B, C, shadow, charged after the response,
  -- a lease of up to LN units, units given back (RT).
  local D = tonumber(argv[3])
  local AL, LL, PP, BB, CC, SH, AF, LN, RT = {}, {}, {}, {}, {}, {}, {}, {}, {}
  -- A lease's deadline (DL), a return's generation (RG).
  local DL, RG = {}, {}
  -- Whether a definition's key has a ban to read (BN), and each key's ban end once read.
  local BN, bans = {}, {}
  for d = 1, D do
    local a = 3 + (d - 1) * 6
    local A = ALGORITHMS[argv[a + 1]]
    if not A then
      return redis.error_reply('tollgate: unknown algorithm ' .. tostring(argv[a + 1]))
    end
    AL[d] = A
    LL[d], PP[d], BB[d], CC[d] = tonumber(argv[a + 2]), tonumber(argv[a + 3]), tonumber(argv[a + 4]), tonumber(argv[a + 5])
    local flags = argv[a + 6]
    SH[d] = string.sub(flags, 1, 1) == '1'
    AF[d] = string.sub(flags, 2, 2) == 'a'
    LN[d] = tonumber(string.match(flags, 'l(%d+)'))
    RT[d] = string.find(flags, 'r', 2, true) ~= nil
    DL[d] = tonumber(string.match(flags, 'd(%d+)'))
    RG[d] = tonumber(string.match(flags, 'r(%d+)'))
    BN[d] = string.find(flags, 'b', 2, true) ~= nil
    if A == ALGORITHMS.cw then
      -- The calendar unit (P) becomes the window at this script's `now`: B its start, P its end.
      BB[d], PP[d] = cal_window(PP[d], now)
    end
  end

  -- Per key: its state (s1, s2, s3), the definition that wrote it, whether a request charged
  -- it, and the expiry it was read with (kept while the state's is the same).
  local loaded, kdef, dirty = {}, {}, {}
  local s1, s2, s3, kx = {}, {}, {}, {}
  local function load(ki, d)
    loaded[ki] = true
    local A = AL[d]
    s1[ki], s2[ki], s3[ki] = A.load(keys[ki], PP[d], now)
    if A.kept then kx[ki] = A.kept(LL[d], PP[d], BB[d], s1[ki], s2[ki], s3[ki]) end
  end

  -- Generations (see above), read once per key: the number, or false when the state has none.
  local gens, newgen, leased = {}, {}, {}
  local function generation(ki)
    if gens[ki] == nil then
      gens[ki] = tonumber(redis.call('GET', keys[ki] .. ':g')) or false
    end
    return gens[ki]
  end
  local late -- Redis TIME (µs) once read: whether a deadline has passed
  local function past(deadline)
    if not late then
      local t = redis.call('TIME')
      late = t[1] * 1000000 + t[2]
    end
    return late >= deadline
  end

  local reply = {}
  local r = 0 -- reply entries so far
  local p = 4 + D * 6
  local R = tonumber(argv[p])
  p = p + 1

  if argv[2] == 'f' then
    -- Settle: each limit on its own; nothing is evaluated or denied.
    for _ = 1, R do
      local n = tonumber(argv[p])
      p = p + 1
      for _ = 1, n do
        local d, ki = tonumber(argv[p]), tonumber(argv[p + 1])
        p = p + 2
        local A = AL[d]
        local lease
        if A == ALGORITHMS.cc then
          lease = argv[p]
          p = p + 1
        end
        if not loaded[ki] then load(ki, d) end
        if RT[d] then
          -- Leased units back: only into a state that still holds them (of their generation).
          if s1[ki] ~= nil and (not RG[d] or generation(ki) == RG[d]) then
            if RG[d] then leased[ki] = true end
            if A.give_back then
              s1[ki], s2[ki], s3[ki] = A.give_back(LL[d], PP[d], BB[d], CC[d], now, s1[ki], s2[ki], s3[ki])
            end
            kdef[ki], dirty[ki] = d, true
          end
        else
          s1[ki], s2[ki], s3[ki] = A.force(LL[d], PP[d], BB[d], CC[d], now, s1[ki], s2[ki], s3[ki], lease)
          kdef[ki], dirty[ki] = d, true
        end
        reply[r + 1], reply[r + 2], reply[r + 3] = 1, LL[d], 0
        reply[r + 4], reply[r + 5], reply[r + 6] = 0, 0, 0
        r = r + 6
      end
    end
    R = 0
  end

  local charge = argv[2] == 'c'
  -- One request's limits: definition, key, verdict, cost (a lease's: what it gets), lease id.
  local jd, jk, jok, jc, jl = {}, {}, {}, {}, {}
  for _ = 1, R do
    local n = tonumber(argv[p])
    p = p + 1
    local admitted = charge
    for j = 1, n do
      local d, ki = tonumber(argv[p]), tonumber(argv[p + 1])
      p = p + 2
      local A = AL[d]
      jl[j] = nil
      if A == ALGORITHMS.cc then
        jl[j] = argv[p]
        p = p + 1
      end
      if not loaded[ki] then load(ki, d) end
      local L, P, B, C = LL[d], PP[d], BB[d], CC[d]
      if LN[d] then
        local avail = 0
        if A.avail then avail = A.avail(L, P, B, now, s1[ki], s2[ki]) end
        if avail >= C then
          local g = avail
          if LN[d] < g then g = LN[d] end
          g = g - g % C -- whole requests' costs
          if g > C then C = g end
        end
      end
      local ok, limit, remaining, retry, reset, delay = A.decide(L, P, B, C, now, s1[ki], s2[ki], s3[ki])
      if LN[d] then
        if ok then delay = C else delay = 0 end
        if DL[d] and past(DL[d]) then
          -- The gateway gave up on this call: nothing granted, nothing charged.
          ok, limit, remaining, retry, reset, delay = false, 0, 0, 0, 0, 0
          admitted = false
        elseif ok and charge then
          -- The generation the units are charged to (a new one for a state without).
          local g = generation(ki)
          if not g then
            if not newgen[ki] then
              local t = redis.call('TIME')
              newgen[ki] = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
            end
            g = newgen[ki]
          end
          retry = g
        end
      end
      if BN[d] then
        if bans[ki] == nil then
          bans[ki] = tonumber(redis.call('GET', keys[ki] .. ':b')) or 0
        end
        if bans[ki] > now then
          -- Banned: refused until the ban's end, nothing charged.
          ok, remaining, retry, reset, delay = false, 0, bans[ki] - now, bans[ki] - now, -1
        end
      end
      if not ok and not SH[d] then admitted = false end
      jd[j], jk[j], jok[j], jc[j] = d, ki, ok, C
      local flag = 0
      if ok then flag = 1 end
      reply[r + 1], reply[r + 2], reply[r + 3] = flag, limit, remaining
      reply[r + 4], reply[r + 5], reply[r + 6] = retry, reset, delay
      r = r + 6
    end

    if admitted then
      for j = 1, n do
        local d = jd[j]
        -- cc in mode 'c' without a lease id ('0') evaluates and takes no slot.
        if jok[j] and not AF[d] and (AL[d] ~= ALGORITHMS.cc or jl[j] ~= '0') then
          local ki = jk[j]
          kdef[ki], dirty[ki] = d, true
          s1[ki], s2[ki], s3[ki] = AL[d].charge(LL[d], PP[d], BB[d], jc[j], now, s1[ki], s2[ki], s3[ki], 1, jl[j])
          if LN[d] then leased[ki] = true end
        end
      end
    end
  end

  -- One write per charged key.
  local ttls = {}
  for ki, _ in pairs(dirty) do
    local d = kdef[ki]
    AL[d].write(keys[ki], LL[d], PP[d], BB[d], now, s1[ki], s2[ki], s3[ki], kx[ki], ttls)
    -- A leased state's generation lives as long as the state.
    if leased[ki] then
      local ttl = redis.call('PTTL', keys[ki])
      if ttl < 1 then ttl = 1 end
      local g = gens[ki] or newgen[ki]
      if gens[ki] then
        redis.call('PEXPIRE', keys[ki] .. ':g', ttl)
      elseif g then
        redis.call('SET', keys[ki] .. ':g', string.format('%d', g), 'PX', ttl)
      end
    end
  end
  return reply
end
