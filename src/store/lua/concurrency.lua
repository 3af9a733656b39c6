-- ratelimit: take a concurrency lease atomically inside Redis.
--
-- KEYS[1]  the sorted set of the (client, name): member = lease id, score =
--          expiry in microseconds (below 2^53: exact in Lua's doubles)
-- ARGV[1]  now in microseconds, or "" to take it from Redis TIME
-- ARGV[2]  max_in_flight, or "release" to release the lease ARGV[4], or
--          "renew" to move its expiry to now + ARGV[3]
-- ARGV[3]  lease_ttl in microseconds
-- ARGV[4]  the new lease's id (the lease's, to release or renew)
-- Returns  {acquired (0/1), in_flight after the call, retry_after_us}
--          retry_after_us: denied, until the oldest held lease expires.
-- Release returns 1 when the lease was held (there and not expired at `now`),
-- else 0; it is removed either way.
-- Renew returns 1 when the lease was held, now with its new expiry (ZADD XX:
-- never a new member), else 0: an expired lease is not revived, as an
-- acquire may have counted its place free.
-- Expired leases are removed first. The key lives until its last lease expires
-- (plus a second), so an abandoned key disappears by itself.

local key = KEYS[1]
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local max = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])

local function str(n) return string.format('%.0f', n) end

-- The key lives until its last lease expires (plus a second).
local function keep_until(expires)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local until_us = math.max(expires, tonumber(last[2]))
  redis.call('PEXPIRE', key, str(math.floor((until_us - now + 999) / 1000) + 1000))
end

local kind = redis.call('TYPE', key).ok
if ARGV[2] == 'renew' then
  if kind ~= 'zset' then return 0 end
  local score = redis.call('ZSCORE', key, ARGV[4])
  if not score or tonumber(score) <= now then return 0 end
  local expires = now + ttl
  redis.call('ZADD', key, 'XX', str(expires), ARGV[4])
  keep_until(expires)
  return 1
end
if ARGV[2] == 'release' then
  if kind ~= 'zset' then return 0 end
  local score = redis.call('ZSCORE', key, ARGV[4])
  if not score then return 0 end
  redis.call('ZREM', key, ARGV[4])
  if tonumber(score) > now then return 1 end
  return 0  -- expired: it was no longer held
end
if kind ~= 'zset' and kind ~= 'none' then
  redis.call('DEL', key)  -- another type under our key: start fresh
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', str(now))
local n = redis.call('ZCARD', key)
if n < max then
  local expires = now + ttl
  redis.call('ZADD', key, str(expires), ARGV[4])
  keep_until(expires)
  return {1, n + 1, 0}
end
local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
return {0, n, tonumber(first[2]) - now}
