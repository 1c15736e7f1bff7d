-- bench/lua-peer/peer.lua: the Kong / APISIX architecture as a benchmark peer for
-- bench/compare.sh: nginx with lua-nginx-module (Debian's libnginx-mod-http-lua, the base of
-- OpenResty, Kong and APISIX) deciding every request on Redis from its access phase, over a
-- keepalive cosocket pool, answering 429 when denied.
--
-- - GCRA by EVALSHA (the script below, as redis-cell / APISIX's limit-req-redis keep a TAT);
-- - Kong's fixed window (its rate-limiting plugin, policy = "redis"): INCRBY the window's key and
--   EXPIRE it, pipelined.
-- A tiny RESP client of its own (lua-resty-redis is not packaged in Debian): one request, one
-- reply, on a socket from the worker's keepalive pool.

local _M = {}

local GCRA = [[
local key, limit, period, burst = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local T = math.floor(period / limit)
if T < 1 then T = 1 end
local tat = tonumber(redis.call('GET', key) or 0)
if tat < now then tat = now end
local new = tat + T
if new - now > burst * T then return 0 end
redis.call('SET', key, new, 'PX', math.floor((new - now) / 1000) + 1)
return 1
]]

local function hex(bin)
    return (bin:gsub('.', function(c) return string.format('%02x', string.byte(c)) end))
end
local SHA = hex(ngx.sha1_bin(GCRA))

local host, port

function _M.init(h, p)
    host, port = h, tonumber(p)
end

local function cmd(args)
    local out = { '*', #args, '\r\n' }
    for _, a in ipairs(args) do
        a = tostring(a)
        out[#out + 1] = '$' .. #a .. '\r\n' .. a .. '\r\n'
    end
    return table.concat(out)
end

-- Reads one reply (status, error, integer, bulk; arrays are not needed here).
local function read_reply(sock)
    local line, err = sock:receive('*l')
    if not line then return nil, err end
    local kind, rest = line:sub(1, 1), line:sub(2)
    if kind == ':' then return tonumber(rest) end
    if kind == '+' then return rest end
    if kind == '-' then return nil, rest end
    if kind == '$' then
        local n = tonumber(rest)
        if n < 0 then return ngx.null end
        local data, e = sock:receive(n + 2)
        if not data then return nil, e end
        return data:sub(1, n)
    end
    return nil, 'unexpected reply ' .. line
end

-- Sends the commands pipelined, returns their replies (nil, err on a failure).
local function pipeline(cmds)
    local sock = ngx.socket.tcp()
    sock:settimeouts(1000, 1000, 1000)
    local ok, err = sock:connect(host, port)
    if not ok then return nil, err end
    local buf = {}
    for i, c in ipairs(cmds) do buf[i] = cmd(c) end
    ok, err = sock:send(table.concat(buf))
    if not ok then sock:close() return nil, err end
    local replies = {}
    for i = 1, #cmds do
        local r, e = read_reply(sock)
        if r == nil and e then
            if e:sub(1, 8) == 'NOSCRIPT' then
                replies[i] = 'NOSCRIPT'
            else
                sock:close()
                return nil, e
            end
        else
            replies[i] = r
        end
    end
    sock:setkeepalive(60000, 64)
    return replies
end

local function gcra_cmd(key, limit, period_us, burst)
    return { 'EVALSHA', SHA, 1, key, limit, period_us, burst }
end

-- Decides a request: `gcra` = {key, limit, period_us, burst}; `window` (optional) =
-- {key prefix, limit, period_s} Kong's fixed window. Exits 429 when denied, 500 on an error.
function _M.decide(gcra, window)
    local cmds = { gcra_cmd(gcra[1], gcra[2], gcra[3], gcra[4]) }
    local wkey
    if window then
        local w = math.floor(ngx.now() / window[3])
        wkey = window[1] .. ':' .. w
        cmds[2] = { 'INCRBY', wkey, 1 }
        cmds[3] = { 'EXPIRE', wkey, window[3] }
    end
    local replies, err = pipeline(cmds)
    if replies and replies[1] == 'NOSCRIPT' then
        pipeline({ { 'SCRIPT', 'LOAD', GCRA } })
        replies, err = pipeline(cmds)
    end
    if not replies then
        ngx.log(ngx.ERR, 'redis: ', err)
        return ngx.exit(500)
    end
    if replies[1] ~= 1 then return ngx.exit(429) end
    if window and tonumber(replies[2]) > window[2] then return ngx.exit(429) end
end

return _M
