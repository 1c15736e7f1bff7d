-- wrk script for bench/compare.sh's random-API-key scenario: every request carries
-- `X-Api-Key: key-NNNNN`, one of 10,000 keys picked at random per request, so the rate limiter
-- sees 10,000 subjects. The requests are formatted once in init(); per request wrk only calls
-- request() to pick one. done() (the WRKRESULT line) comes from wrk-report.lua, next to this file.
--
-- Optional arguments (after wrk's `--`), for bench/rls.sh:
--   wrk ... -s wrk-keys.lua URL -- N          N keys instead of 10,000
--   wrk ... -s wrk-keys.lua URL -- N /deny    every other request goes to the path /deny
local KEYS = 10000
local reqs = {}
local deny = nil
local flip = false

local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "wrk-report.lua")

function init(args)
   math.randomseed(os.time() + (tonumber(tostring({}):match("0x(%x+)"), 16) or 0))
   KEYS = tonumber(args[1]) or KEYS
   for i = 1, KEYS do
      reqs[i] = wrk.format(nil, nil, { ["X-Api-Key"] = string.format("key-%05d", i - 1) })
   end
   if args[2] then
      deny = {}
      for i = 1, KEYS do
         deny[i] = wrk.format(nil, args[2], { ["X-Api-Key"] = string.format("key-%05d", i - 1) })
      end
   end
end

function request()
   if deny then
      flip = not flip
      if flip then
         return deny[math.random(KEYS)]
      end
   end
   return reqs[math.random(KEYS)]
end
