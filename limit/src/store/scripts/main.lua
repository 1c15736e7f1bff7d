-- main.lua: the library's one entry point, last (src/store/redis/script.rs SOURCE). Redis runs
-- it as the function `tollgate_<version>` (`FCALL`, the library loaded once by `FUNCTION
-- LOAD`: every table and function above is built once, not per call) or, where functions are
-- not available, as the body of an `EVAL` script (`return main(KEYS, ARGV)`, built per call).
-- argv[2] names the mode: 'r' runs (runs.lua); 'c', 'e', 'f' decide and settle (decide.lua);
-- 'reset' and 'grant' support's corrections, 'ban…' and 'unban' the
-- shared penalty box (quota.lua).

local function main(keys, argv)
  local mode = argv[2]
  if mode == 'r' then return runs(keys, argv) end
  if mode == 'reset' or mode == 'grant' then return quota(keys, argv) end
  if string.sub(mode, 1, 3) == 'ban' or mode == 'unban' then return bans(keys, argv) end
  return decide(keys, argv)
end
