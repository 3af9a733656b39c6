-- wrk script used by scripts/bench.sh for every HTTP target alike (so the
-- client does the same work per request whatever the server): KIND=get|check|gateway,
-- KEYS distinct client keys, the same requests as bench/macro/http_load.cc.
local kind = os.getenv("KIND") or "get"
local nkeys = tonumber(os.getenv("KEYS") or "100000")
local reqs = {}
local i = 0

function init(args)
  local n = (kind == "get") and 1 or nkeys
  for j = 0, n - 1 do
    local key = "k" .. ((j * 2654435761) % nkeys)
    if kind == "get" then
      reqs[#reqs + 1] = wrk.format("GET", "/")
    elseif kind == "check" then
      local body = '{"key":"' .. key .. '","limits":[{"name":"b","algorithm":"token_bucket",' ..
                   '"capacity":10,"refill_per_second":5}]}'
      reqs[#reqs + 1] = wrk.format("POST", "/v1/check", {["Content-Type"] = "application/json"}, body)
    else
      reqs[#reqs + 1] = wrk.format("GET", "/api/x", {["X-API-Key"] = key})
    end
  end
end

function request()
  i = i % #reqs + 1
  return reqs[i]
end

-- Answers are checked too: anything but 200/429, and any answer ratelimitd
-- marks as decided by its failure mode (X-RateLimit-Degraded), is counted and
-- printed by done() as "bench: degraded=N other=N"; scripts/bench.sh fails the
-- run if either is not 0 (a fast degraded answer must not pass for throughput).
local threads = {}
degraded = 0
other = 0

function setup(thread)
  threads[#threads + 1] = thread
end

function response(status, headers, body)
  if status ~= 200 and status ~= 429 then other = other + 1 end
  for name, _ in pairs(headers) do
    if string.lower(name) == "x-ratelimit-degraded" then degraded = degraded + 1 end
  end
end

function done(summary, latency, requests)
  local d, o = 0, 0
  for _, t in ipairs(threads) do
    d = d + t:get("degraded")
    o = o + t:get("other")
  end
  io.write(string.format("bench: degraded=%d other=%d\n", d, o))
end
