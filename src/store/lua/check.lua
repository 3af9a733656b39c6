-- ratelimit: decide a batch of checks atomically inside Redis.
--
-- The arithmetic is exactly that of src/core/algorithms.cc; the conformance
-- suite (tests/conformance_test.cc) runs one table against both. All values
-- are integers (microseconds, counts) below 2^53, so Lua's doubles are exact,
-- and every number returned is already whole (Redis truncates Lua numbers).
--
-- ARGV[1]  now in microseconds, or "" to take it from Redis TIME
-- ARGV[2]  number of distinct limits S in this call; then for each (4 values):
--            algorithm ("t" token bucket, "k" leaky bucket, "f" fixed window,
--            "s" sliding window, "l" sliding log; "T" a token bucket that takes several tokens,
--            below), limit, window (us; token and leaky bucket: capacity or
--            depth x interval), interval (us, token and leaky bucket only)
--            ("c" a calendar quota: limit, then the end of the current
--            window and the end of the next, in us since the epoch; below)
-- then     the number of checks; then for each check either
--            - one number v: a check of one limit that consumes, its limit's
--              index i among the S (1-based) and its cost c >= 1 packed as
--              v = (c - 1) x S + i (the common case: one argument a check), or
--            - "c" to check and consume or "p" to peek (never writes) followed
--              by its number of limits n ("c1", "p2"), then for each limit
--              its index among the S and its cost.
--            (A limit shared by many checks of a batch is sent and parsed once.)
-- KEYS     one per limit of each check, in the same order; two for a calendar
--          quota ("c"): its current window's key, then the next one's; and
--          after those, for a limit with a block period ("t/<us>"), its block
--          key (below). Every key the script touches is in KEYS, so that
--          Redis Cluster routes the call by all of them (ASK, TRYAGAIN while
--          a slot migrates) before anything runs, instead of the script
--          failing halfway on a key the node no longer serves.
-- Returns  for each limit: allowed (0/1), remaining, retry_after_us, reset_after_us.
--          The leaky bucket is the token bucket's GCRA (tau = depth x interval);
--          the caller derives an allowed request's delay, reset_after - cost x
--          interval (core::LeakyDelay), so the reply keeps 4 values per limit.
--          "T" (token prefetch) takes as many tokens as there are, at most `cost`, at
--          least 1 (else it is denied as a cost of 1 would be); its allowed
--          value is the number of tokens taken.
--          A check is all or nothing: state is written only when all its limits allow;
--          when one denies, the others answer for their state as it stands (cost 0).

local rcall, rpcall = redis.call, redis.pcall  -- locals: no global lookup per call

-- Node mode (Redis Cluster; src/store/redis_store.cc, node calls): the checks of
-- many slots served by ONE node in one call. The script is then loaded with
-- the shebang line "#!lua flags=allow-cross-slot-keys" and called with no
-- KEYS; ARGV is "N", the number of keys n, the n keys, then the arguments
-- above. Redis routes nothing here: the caller picked the node from its slot
-- map, which may be stale (a slot moved or migrating). Every key is read
-- before anything is written (the MGETs below, one per key: a multi-key
-- command must stay in one slot), so a key this node does not serve stops
-- the call with the error "RLNOTLOCAL ..." before it changed anything, and
-- the caller sends those checks again one slot per call, where MOVED and ASK
-- are followed. (Block keys, "<key>!b", are among the keys: read first too.)
local KEYS, ARGV = KEYS, ARGV
local node_mode = ARGV[1] == 'N'
if node_mode then
  local n = tonumber(ARGV[2])
  local k, a = {}, {}
  for i = 1, n do k[i] = ARGV[2 + i] end
  for i = 3 + n, #ARGV do a[#a + 1] = ARGV[i] end
  KEYS, ARGV = k, a
end

local now = tonumber(ARGV[1])
if not now then
  local t = rcall('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Every closure and table is made again on each call, and Redis pays for it
-- (issue 22; docs/performance.md, section 1): under callgrind a call of one
-- token-bucket check took 119,800 instructions when this script made all its
-- 19 closures up front (an empty script: 27,200), 99,000 now that the path of
-- the common check (one token bucket that consumes) makes four (ttl_ms, set,
-- token_bucket, general) and general() makes the rest for the first check or
-- call that needs them.
local floor, fmt = math.floor, string.format
local peek = false
local out, nout = {}, 0
local argi = 3
local keyi = 1

-- The key's TTL: until its state equals the fresh state, plus a second, and
-- at least 10-15 s. The floor is for Redis' expire cycle: a client that comes
-- back within it overwrites its key instead of having it expire and be made
-- again, and a Redis expiring tens of thousands of short-lived keys a second
-- stalls every call in `expire-cycle` runs of several ms (issue 22;
-- docs/performance.md, "Where the tail comes from"). The floor's 0-5 s spread
-- (from the clock's microseconds, which a burst of calls does not share) is
-- for a burst of new clients: made within a few seconds, their keys would
-- otherwise all expire within those seconds again, 10 s later, and stall
-- Redis then (15-18 ms expire-cycle runs measured in `make bench`'s row 3b).
-- A key's state past its time reads as fresh, so a longer life changes no
-- answer. Strings, not Lua numbers: Redis 7.2+ prints numbers with
-- fpconv_dtoa, which writes 100000000 as "1e+08", and PX refuses that. Every
-- number here is whole and below 2^53: %d prints it exactly (and cheaper than
-- %.0f). The floor is the common TTL: formatted once a call.
local ttl_floor = 10000 + (now % 1000) * 5
local ttl_floor_str = fmt('%d', ttl_floor)
local function ttl_ms(until_us)
  local ms = floor((until_us - now + 999) / 1000) + 1000
  if ms <= ttl_floor then return ttl_floor_str end
  return fmt('%d', ms)
end

-- The string states of every key of the call, read with one MGET: each
-- redis.call costs far more than the key lookup it makes, and a GET per key
-- was half the calls of a batch. A key of another type (a sliding log's
-- sorted set) reads as nil: its state starts fresh. The table is kept
-- current as the script writes: a batch may check one key twice, and the
-- second check must see the first one's write.
local values = {}
if node_mode then
  for j = 1, #KEYS do
    local got = rpcall('MGET', KEYS[j])
    if got.err then return redis.error_reply('RLNOTLOCAL ' .. got.err) end
    if got[1] then values[KEYS[j]] = got[1] end
  end
else
  local n, i = #KEYS, 1
  while i <= n do  -- in chunks: unpack() has a small stack
    local last = math.min(n, i + 999)
    local got = rcall('MGET', unpack(KEYS, i, last))
    for j = i, last do
      local v = got[j - i + 1]
      if v then values[KEYS[j]] = v end
    end
    i = last + 1
  end
end

local function set(key, value, ttl)
  rcall('SET', key, value, 'PX', ttl)
  values[key] = value
end

-- The token bucket (GCRA; "t", and "k", the leaky bucket): allowed,
-- remaining, retry_after, reset_after, and the new TAT to write when the
-- whole check is allowed. With `write_now` (a one-limit check that consumes)
-- an allowed decision is written here.
local function token_bucket(key, tau, iv, cost, write_now)
  local tat = tonumber(values[key]) or 0
  if tat < now then tat = now end
  local new_tat = tat + cost * iv
  if new_tat - tau <= now then
    if write_now and new_tat > now then
      set(key, fmt('%d', new_tat), ttl_ms(new_tat))
    end
    local room = tau - (new_tat - now)
    return 1, room > 0 and floor(room / iv) or 0, 0, new_tat - now, new_tat
  end
  local room = tau - (tat - now)
  return 0, room > 0 and floor(room / iv) or 0, new_tat - tau - now, tat - now, nil
end

-- Everything but the common check, made on first need: the other
-- evaluators, block periods, checks of several limits or peeks, settlement.
local G
local function general()
  if G then return G end
  local function str(n) return fmt('%d', n) end

  -- Each evaluator returns allowed, remaining, retry_after, reset_after and a
  -- writer to call when the whole check is allowed (nil if nothing to write
  -- or, with `write_now`, written already).
  local function set_tat(key, new_tat)
    if new_tat > now then set(key, str(new_tat), ttl_ms(new_tat)) end
  end

  local function bucket(key, _, tau, iv, cost, write_now)
    local allowed, rem, retry, reset, new_tat = token_bucket(key, tau, iv, cost, write_now)
    if allowed == 1 and not write_now then
      return 1, rem, 0, reset, function() set_tat(key, new_tat) end
    end
    return allowed, rem, retry, reset, nil
  end

  local function token_prefetch(key, cap, tau, iv, want, write_now)
    local tat = tonumber(values[key]) or 0
    if tat < now then tat = now end
    local n = math.max(1, math.min(want, floor((now + tau - tat) / iv)))
    local allowed, rem, retry, reset, writer = bucket(key, cap, tau, iv, n, write_now)
    if allowed == 1 then allowed = n end
    return allowed, rem, retry, reset, writer
  end

  local function parse_window(key)
    local v = values[key]
    if not v then return nil end
    local idx, n0, n1 = string.match(v, '^(%-?%d+):(%d+):(%d+)$')
    if not idx then return nil end
    return tonumber(idx), tonumber(n0), tonumber(n1)
  end

  -- The window a count goes in: now's, or the stored one if later (a clock
  -- behind the one that wrote it: another instance's with time_source local).
  -- Taken for a fresh window it would overwrite that window's count
  -- (core/algorithms.cc, WindowIndex). Waits are still measured from now.
  local function window_index(w, sidx)
    local idx = floor(now / w)
    if sidx and sidx > idx then return sidx end
    return idx
  end

  local function fixed_window(key, limit, w, _, cost)
    local sidx, _, sn1 = parse_window(key)
    local idx = window_index(w, sidx)
    local ends = (idx + 1) * w
    local count = 0
    if sidx == idx then count = sn1 end
    if count + cost <= limit then
      local after = count + cost
      local reset = 0
      if after > 0 then reset = ends - now end
      return 1, limit - after, 0, reset, function()
        if after > 0 then
          set(key, str(idx) .. ':0:' .. str(after), ttl_ms(ends))
        end
      end
    end
    return 0, math.max(0, limit - count), ends - now, ends - now, nil
  end

  -- A calendar quota: a fixed window whose boundaries the caller computed
  -- (Lua knows no time zones) from its own clock: `b` ends the window it sees
  -- as current, whose count is in KEYS[ki], and `c` ends the next, whose count
  -- is in KEYS[ki + 1] (each key is named by its window's start). Redis' clock
  -- picks: before b the first, from b on the second. (An instance clock ahead
  -- of Redis' counts a request of the last moments before the boundary in the
  -- new window; one behind, in the old: docs/architecture.md.)
  local function calendar_window(key, limit, b, c, cost, _, ki)
    local ends = b
    if now >= b then key, ends = KEYS[ki + 1], c end
    if ends <= now then ends = now + 1 end  -- clocks a window apart: never a reset in the past
    local count = tonumber(values[key]) or 0
    if count + cost <= limit then
      local after = count + cost
      local reset = 0
      if after > 0 then reset = ends - now end
      return 1, limit - after, 0, reset, function()
        if after > 0 then set(key, str(after), ttl_ms(ends)) end
      end
    end
    return 0, math.max(0, limit - count), ends - now, ends - now, nil
  end

  local function sliding_window(key, limit, w, _, cost)
    local wm = w / 1000
    local sidx, sn0, sn1 = parse_window(key)
    local idx = window_index(w, sidx)
    local start = idx * w
    local em = floor(math.max(0, now - start) / 1000)
    local prev, cur = 0, 0
    if sidx == idx then prev, cur = sn0, sn1 elseif sidx == idx - 1 then prev = sn1 end
    local weighted = prev * (wm - em)
    local function reset_after(c)
      if c > 0 then return start + 2 * w - now end
      if weighted > 0 then return start + w - now end
      return 0
    end
    if weighted + (cur + cost) * wm <= limit * wm then
      local after = cur + cost
      return 1, floor((limit * wm - weighted - after * wm) / wm), 0, reset_after(after), function()
        if after > 0 or prev > 0 then
          set(key, str(idx) .. ':' .. str(prev) .. ':' .. str(after), ttl_ms(start + 2 * w))
        end
      end
    end
    local rem = math.max(0, floor((limit * wm - weighted - cur * wm) / wm))
    local allow_at
    if cur + cost <= limit then
      local room = floor((limit - cur - cost) * wm / prev)
      allow_at = start + (wm - room) * 1000
    elseif cur == 0 then
      allow_at = start + w
    else
      local room = math.min(wm, floor((limit - cost) * wm / cur))
      allow_at = start + w + (wm - room) * 1000
    end
    return 0, rem, math.max(allow_at - now, 1), reset_after(cur), nil
  end

  local function sliding_log(key, limit, w, _, cost)
    local t = rpcall('TYPE', key)
    if type(t) == 'table' then t = t.ok end
    if t ~= 'zset' and t ~= 'none' then
      if not peek then
        rcall('DEL', key)
        values[key] = nil
      end
    end
    local live = 0
    if t == 'zset' then live = rcall('ZCOUNT', key, '(' .. str(now - w), '+inf') end
    local newest = nil
    if live > 0 then
      newest = tonumber(rcall('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    end
    if live + cost <= limit then
      local last = now
      if cost == 0 then
        if newest then last = newest else last = now - w end
      end
      return 1, limit - live - cost, 0, last + w - now, function()
        if cost == 0 then return end
        rcall('ZREMRANGEBYSCORE', key, '-inf', str(now - w))
        local at = now
        if newest and newest > at then at = newest end
        local card = rcall('ZCARD', key)
        local i = 1
        while i <= cost do  -- in chunks: unpack() has a small stack
          local args = {}
          local last = math.min(cost, i + 499)
          for j = i, last do
            args[#args + 1] = str(at)
            args[#args + 1] = str(at) .. ':' .. str(card + j)
          end
          rcall('ZADD', key, unpack(args))
          i = last + 1
        end
        rcall('PEXPIRE', key, ttl_ms(at + w))
      end
    end
    local must_leave = live + cost - limit
    local oldest = rcall('ZRANGEBYSCORE', key, '(' .. str(now - w), '+inf', 'WITHSCORES',
                         'LIMIT', must_leave - 1, 1)
    return 0, math.max(0, limit - live), tonumber(oldest[2]) + w - now, newest + w - now, nil
  end

  local evaluators = {
    t = bucket,
    k = bucket,
    T = token_prefetch,
    f = fixed_window,
    s = sliding_window,
    l = sliding_log,
    c = calendar_window,
  }

  -- Block periods (issue 21; Limit::block_for): a limit's code followed by
  -- "/<us>" ("f/600000000") blocks the client on it for that long once it
  -- denies (not on a peek). The block is the key <limit's key>!b (the same hash
  -- tag, so the same Cluster slot; a calendar quota's is the limit's, across
  -- windows) holding when it ends; while it stands every check of the limit
  -- is denied: remaining 0, retry_after until its end, reset_after at least
  -- that. The caller names it (src/store/redis_keys.h) as the limit's last
  -- key, `nkeys` - 1 after its first: read with the others (MGET above).
  local function blocking(evaluate, block_us, nkeys)
    return function(key, a, b, c, cost, write_now, ki)
      local bkey = KEYS[ki + nkeys - 1]
      local ends = tonumber(values[bkey])
      if ends and ends > now then
        local _, _, _, reset = evaluate(key, a, b, c, 0, false, ki)
        return 0, 0, ends - now, math.max(reset, ends - now), nil
      end
      local allowed, rem, retry, reset, writer = evaluate(key, a, b, c, cost, write_now, ki)
      if allowed > 0 or peek then return allowed, rem, retry, reset, writer end
      set(bkey, str(now + block_us), ttl_ms(now + block_us))
      return 0, 0, block_us, math.max(reset, block_us), nil
    end
  end

  -- The evaluator of a limit's spec (made once a call: spec[7]).
  local function evaluator(spec)
    local ev = spec[7]
    if ev then return ev end
    local code = spec[1]
    local block = tonumber(string.sub(code, 3))
    ev = evaluators[code]
    if block then ev = blocking(evaluators[string.sub(code, 1, 1)], block, spec[5]) end
    spec[7] = ev
    return ev
  end

  local function eval(spec, ki, cost, write_now)
    return evaluator(spec)(KEYS[ki], spec[2], spec[3], spec[4], cost, write_now, ki)
  end

  -- A check other than the common one: a packed one whose limit is not a
  -- plain token bucket, or "c<n>"/"p<n>" (several limits, or a peek). A check
  -- is all or nothing: state is written only when all its limits allow; when
  -- one denies, the others answer for their state as it stands (cost 0, as
  -- core::Standing); the denying ones keep their numbers.
  local function check(head, packed, specs, nspecs)
    local n
    if packed then
      n, peek = 1, false
    else
      peek = string.byte(head, 1) == 112  -- 'p'
      n = tonumber(string.sub(head, 2))
    end
    local keyi0, argi0, nout0 = keyi, argi, nout  -- where this check starts
    local writers = n > 1 and {} or nil  -- one limit: written at once, no table
    local write_now = n == 1 and not peek
    local all = true
    for _ = 1, n do
      local spec, cost
      if packed then
        spec, cost = specs[(packed - 1) % nspecs + 1], floor((packed - 1) / nspecs) + 1
      else
        spec, cost = specs[tonumber(ARGV[argi])], tonumber(ARGV[argi + 1])
        argi = argi + 2
      end
      if peek then cost = 0 end
      local allowed, rem, retry, reset, writer = eval(spec, keyi, cost, write_now)
      keyi = keyi + spec[5]
      out[nout + 1], out[nout + 2], out[nout + 3], out[nout + 4] = allowed, rem, retry, reset
      nout = nout + 4
      if allowed > 0 then
        if write_now then
          if writer then writer() end  -- the evaluators that do not write at once
        elseif n > 1 then
          writers[#writers + 1] = writer
        end
      else
        all = false
      end
    end
    if n > 1 and all and not peek then
      for _, write in ipairs(writers) do write() end
    elseif n > 1 and not peek then
      peek = true
      local ai, o, ki = argi0, nout0, keyi0
      for _ = 1, n do
        local spec = specs[tonumber(ARGV[ai])]
        ai = ai + 2
        if out[o + 1] > 0 then
          local _, rem, _, reset = eval(spec, ki, 0, false)
          out[o + 2], out[o + 3], out[o + 4] = rem, 0, reset
        end
        o = o + 4
        ki = ki + spec[5]
      end
    end
    peek = false
  end

  -- Settlement (issue 21; include/ratelimit/store.h, SettleRequest): ARGV[2] is
  -- "S" instead of the number of limits, ARGV[3] the number of limits n, then
  -- for each (5 values) its algorithm code ("t", "k", "f", "s"), limit, window,
  -- interval (as above) and the difference to apply (> 0 a debit, < 0 a
  -- refund), then (with a once key) its ttl in ms. KEYS: one per limit, then
  -- the once key if any. Every limit changes in this one call, as
  -- core::SettleState: a bucket may go into debt (at most a year of refill
  -- past its capacity), a refund stops at a full bucket, a window's current
  -- counter stays in [0, limit]. The reply: per limit the 4 values of a check,
  -- the state afterwards as the next request of cost 1 meets it (core::Probe).
  local max_debt = 366 * 86400000000

  local function settle_state(key, code, limit, w, iv, delta)
    if code == 't' or code == 'k' then
      local base = math.max(tonumber(values[key]) or 0, now)
      local nxt = base + delta * iv
      if delta > 0 then nxt = math.max(base, math.min(nxt, now + w + max_debt)) end
      if nxt > now then return set(key, str(nxt), ttl_ms(nxt)) end
    else
      local sidx, sn0, sn1 = parse_window(key)
      local idx = window_index(w, sidx)
      local prev, cur = 0, 0
      if sidx == idx then prev, cur = sn0, sn1 elseif sidx == idx - 1 and code == 's' then prev = sn1 end
      local after = math.min(math.max(cur + delta, 0), limit)
      local ends = (idx + 1) * w
      if code == 's' then ends = ends + w end
      if after > 0 or prev > 0 then
        return set(key, str(idx) .. ':' .. str(prev) .. ':' .. str(after), ttl_ms(ends))
      end
    end
    rcall('DEL', key)  -- the fresh state
    values[key] = nil
  end

  local function settle()
    peek = true  -- the probes below write nothing
    local n, ai = tonumber(ARGV[3]), 4
    -- Once (SettleRequest::once): KEYS[n + 1] marks it settled for
    -- ARGV[4 + 5n] ms; already there, nothing is applied and the reply is {-1}.
    if KEYS[n + 1] and not rcall('SET', KEYS[n + 1], '1', 'NX', 'PX', ARGV[4 + 5 * n]) then
      return {-1}
    end
    for i = 1, n do
      local code, limit, w, iv = ARGV[ai], tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2]),
                                 tonumber(ARGV[ai + 3])
      settle_state(KEYS[i], code, limit, w, iv, tonumber(ARGV[ai + 4]))
      local evaluate = evaluators[code]
      local allowed, _, retry = evaluate(KEYS[i], limit, w, iv, 1, false)
      local _, rem, _, reset = evaluate(KEYS[i], limit, w, iv, 0, false)
      out[4 * i - 3], out[4 * i - 2], out[4 * i - 1], out[4 * i] = allowed, rem, retry, reset
      ai = ai + 5
    end
    return out
  end

  G = {check = check, settle = settle}
  return G
end

if ARGV[2] == 'S' then return general().settle() end

-- The limits: {code, limit, window, interval, keys per limit (a calendar
-- quota's two; one more with a block period: a code longer than a letter),
-- whether it is a plain token bucket (decided inline below), its evaluator
-- once made}.
local specs = {}
local nspecs = tonumber(ARGV[2])
for s = 1, nspecs do
  local code = ARGV[argi]
  local nkeys = string.byte(code, 1) == 99 and 2 or 1
  if #code > 1 then nkeys = nkeys + 1 end
  specs[s] = {code, tonumber(ARGV[argi + 1]), tonumber(ARGV[argi + 2]), tonumber(ARGV[argi + 3]),
              nkeys, code == 't' or code == 'k'}
  argi = argi + 4
end
local checks = tonumber(ARGV[argi])
argi = argi + 1
for _ = 1, checks do
  local head = ARGV[argi]
  argi = argi + 1
  local packed = tonumber(head)  -- nil for "c..."/"p..."
  local spec = packed and specs[(packed - 1) % nspecs + 1]
  if spec and spec[6] then
    -- The common check: one plain token bucket that consumes, written at once.
    out[nout + 1], out[nout + 2], out[nout + 3], out[nout + 4] =
        token_bucket(KEYS[keyi], spec[3], spec[4], floor((packed - 1) / nspecs) + 1, true)
    keyi, nout = keyi + 1, nout + 4
  else
    general().check(head, packed, specs, nspecs)
  end
end
return out
