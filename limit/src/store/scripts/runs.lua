-- runs.lua: the decide mode 'r' (main.lua sends it here): a batch of requests as runs, replayed
-- by the gateway. The calling convention is decide.lua's up to the definitions; then one
-- argument holds the runs, each "k·16 + n" then its n (definition, key) pairs, every number as
-- two characters ('0' + x % 64, '0' + x / 64: no argument and no strtod per number).
--
-- In mode 'r' a batch arrives as runs: k identical requests (the same limits on the same keys)
-- sent once with their count. Every request of a batch is decided at the same `now`, and a
-- limit's state changes only when it is charged, so a run's outcome is monotone: if a limit
-- denies the i-th request of a run, it denies every later one too. How many of a run a limit
-- admits is therefore one division (the algorithm's `capacity`), not k decisions, and charging
-- m of them is one step (its `charge`). The gateway replays the batch request by request from
-- the states the script read (its reply) with the same pure algorithms as the in-process store
-- (src/limiter/algorithm.rs), so every request's decision is computed exactly as decide.lua's
-- per-request loop would.
--
-- Only fw, sw, tb, gcra and lb take this path (the gateway sends the rest in mode 'c'): the
-- sliding log's state is a list, a concurrency limit's requests differ in their lease ids, and
-- a calendar window is computed by decide.lua's definitions.
--
-- Reply: every key's value before the batch, as MGET read it (the state's string, nil for a
-- missing key: the gateway decodes it as state.lua does), then `now` — the MGET's own reply with
-- one entry added, so that the reply costs the script nothing per key.

local function runs(keys, argv)
  local now = clock(argv[1])
  -- Definitions, 7 entries each at 7·(d − 1) + 1 …: the algorithm's table, L, P, B, C, shadow,
  -- charged after the response. Numbers are read with `+ 0`, not tonumber(): Lua 5.1's
  -- tonumber converts a string twice (lua_isnumber, then lua_tonumber), each a strtod.
  local D = argv[3] + 0
  local DF = {}
  for d = 0, D - 1 do
    local a, o = 3 + d * 6, d * 7
    local flags = argv[a + 6]
    local A = ALGORITHMS[argv[a + 1]]
    if not A or not A.capacity then
      return redis.error_reply('tollgate: algorithm ' .. tostring(argv[a + 1]) .. ' cannot be sent as runs')
    end
    DF[o + 1], DF[o + 2], DF[o + 3], DF[o + 4], DF[o + 5] =
      A, argv[a + 2] + 0, argv[a + 3] + 0, argv[a + 4] + 0, argv[a + 5] + 0
    DF[o + 6], DF[o + 7] = string.byte(flags, 1) == 49, string.byte(flags, 2) == 97
  end
  -- A1..A3: the keys' states as the runs charge them. Every key of this mode is a string: all
  -- read by one MGET (one command, not one per key).
  local vals = redis.call('MGET', unpack(keys))
  local A1, A2, A3, KD, KX, W, seen = {}, {}, {}, {}, {}, {}, {}
  local jo, jk, jc = {}, {}, {}
  -- The runs, one argument: every number as two characters, '0' + x % 64 then '0' + x / 64
  -- (src/store/redis/script.rs RUN_DIGITS), all read by one string.byte.
  local RS = argv[4 + D * 6]
  local X = {string.byte(RS, 1, #RS)}
  local p, last = 1, #RS
  while p < last do
    local h = X[p] + X[p + 1] * 64 - 3120 -- 3120 = 48 + 48 * 64
    p = p + 2
    local n = h % 16
    local k = (h - n) / 16
    local admitted = k
    for j = 1, n do
      local o, ki = (X[p] + X[p + 1] * 64 - 3121) * 7, X[p + 2] + X[p + 3] * 64 - 3120
      p = p + 4
      local A = DF[o + 1]
      if not seen[ki] then
        seen[ki] = true
        local v = vals[ki]
        if v then
          local a, b, c = A.read(v)
          if a then
            A1[ki], A2[ki], A3[ki] = a, b, c
            KX[ki] = A.expiry(DF[o + 2], DF[o + 3], DF[o + 4], a, b, c) -- A.kept, as no cw runs
          end
        end
      end
      local cap = A.capacity(DF[o + 2], DF[o + 3], DF[o + 4], DF[o + 5], now, A1[ki], A2[ki], A3[ki], k)
      -- A limit charged after the response is never charged here: it admits all or none.
      if cap > 0 and DF[o + 7] then cap = k end
      jo[j], jk[j], jc[j] = o, ki, cap
      if cap < admitted and not DF[o + 6] then admitted = cap end
    end
    for j = 1, n do
      -- A shadow limit is charged only for the requests it admitted itself.
      local m = jc[j]
      if m > admitted then m = admitted end
      local o = jo[j]
      if m > 0 and not DF[o + 7] then
        local ki = jk[j]
        A1[ki], A2[ki], A3[ki] = DF[o + 1].charge(DF[o + 2], DF[o + 3], DF[o + 4], DF[o + 5], now, A1[ki], A2[ki], A3[ki], m)
        if not KD[ki] then W[#W + 1] = ki end
        KD[ki] = o
      end
    end
  end

  -- One write per charged key (state.lua).
  local ttls = {}
  for i = 1, #W do
    local ki = W[i]
    local o = KD[ki]
    state_write(keys[ki], DF[o + 1], DF[o + 2], DF[o + 3], DF[o + 4], now, A1[ki], A2[ki], A3[ki], KX[ki], ttls)
  end
  vals[#keys + 1] = now
  return vals
end
