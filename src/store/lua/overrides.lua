-- The per-client overrides (include/ratelimit/override_store.h).
-- KEYS[1]: the hash (client -> record), KEYS[2]: the version counter; both
-- under one hash tag. ARGV[1]: the operation, ARGV[2]: the channel.
--   read                      -> {version, {client, record, client, record, ...}}
--   put <client> <record>     -> {version, 1}
--   remove <client> [record]  -> {version, removed (0|1)}; with a record, only
--                                while the client's record is still that one
--   announce <message>        -> {version, 0}: PUBLISHes the message (an admin
--                                reset of a client's state: "reset <client>")
-- A change increments the version and PUBLISHes it on the channel, in the
-- same call: an instance that hears version v and reads gets v or later.
local op = ARGV[1]
local version = tonumber(redis.call('GET', KEYS[2]) or '0')
if op == 'read' then
  return {version, redis.call('HGETALL', KEYS[1])}
end
if op == 'announce' then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return {version, 0}
end
local changed = 0
if op == 'put' then
  redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
  changed = 1
elseif op == 'remove' then
  if ARGV[4] == nil or redis.call('HGET', KEYS[1], ARGV[3]) == ARGV[4] then
    changed = redis.call('HDEL', KEYS[1], ARGV[3])
  end
else
  return redis.error_reply('unknown operation ' .. tostring(op))
end
if changed == 1 then
  version = redis.call('INCR', KEYS[2])
  redis.call('PUBLISH', ARGV[2], tostring(version))
end
return {version, changed}
