-- claim(KEYS=queue keys, claim, claim's messages; ARGV=[queue script args, claim_id, ttl, grace, limit,
--       wait_ms, client id])
--   -> {lib.lua marks(), n_dead_lettered, n_discarded, next_ms, view1, view2, ...}
--   (no claim is stored when no view is returned; the flag: lib.lua SWEEP). When nothing was claimed,
--   next_ms is the earliest time a message becomes claimable by time alone (its delay or backoff ends, its
--   claim expires), 0 when none will; and with wait_ms > 0 (a long poll that will wait that long) the
--   queue's `waiting` flag is set for at least wait_ms, so that whatever makes a message claimable
--   publishes a wake-up (lib.lua publish_wakes).
-- Takes the oldest ready messages, up to `limit`. Each one's claim_count is incremented in this script
-- (promise 5), and the client id is kept on it as its last claimer ('ccl', which lib.lua dead_letter moves
-- into the provenance). A message whose count already equals _max_claim_count is moved to the DLQ (or
-- discarded when the queue has none) instead of being returned, and picking goes on past it until `limit`
-- messages are claimed or none is left (promise 4). Cost: O(limit * log M) for M queued messages.
local prefix, name, now, K = queue_script()
local claim_id, ttl, grace, limit = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local wait_ms, client = tonumber(ARGV[11]), ARGV[12]
local ck, cmk = KEYS[9], KEYS[10]
local pol = policy(K)
housekeep(prefix, K, name, now, pol)
local ce = now + ttl * 1000
local out = {0, 0, 0, 0}
local got = 0
local held, taken = {}, {}  -- the claimed index's score/id pairs and the claim's ids: one call each below
while got < limit do
  local ids = redis.call('ZRANGE', K.ready, 0, limit - got - 1)
  if #ids == 0 then break end
  call_all('ZREM', K.ready, ids)
  for _, id in ipairs(ids) do
    local mk = message_key(prefix, id)
    local f = redis.call('HMGET', mk, 'e', 'cc')
    if not f[1] then
      unindex(K, id)
    elseif tonumber(f[1]) <= now then
      remove_message(prefix, K, id)
    elseif exhausted(pol, tonumber(f[2])) then
      local moved = dead_letter(prefix, K, name, id, 'max_claims', now, pol)
      out[3 - moved] = out[3 - moved] + 1  -- [2] moved, [3] discarded
    else
      redis.call('HSET', mk, 'cc', (tonumber(f[2]) or 0) + 1, 'c', claim_id, 'ce', ce, 'ccl', client)
      -- Zaqar's grace rule: a claimed message lives at least until the claim ends plus grace
      if tonumber(f[1]) < ce + grace * 1000 then set_expiry(K, mk, id, ce + grace * 1000, now) end
      table.insert(held, ce); table.insert(held, id); table.insert(taken, id)
      table.insert(out, view(mk, name, id, now))
      got = got + 1
    end
  end
end
if got > 0 then
  zadd_all(K.claimed, held)
  call_all('RPUSH', cmk, taken)
  local qc = redis.call('HGET', K.queue, 'created') or ''
  redis.call('HSET', ck, 'q', name, 'ttl', ttl, 'grace', grace, 'cr', now, 'e', ce, 'qc', qc)
  local keep = (ttl + grace) * 1000 + 300000
  redis.call('PEXPIRE', ck, keep)
  redis.call('PEXPIRE', cmk, keep)
  schedule(K, ce)
else
  local nxt
  for _, index in ipairs({K.delayed, K.claimed}) do
    local first = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
    if #first > 0 and (not nxt or tonumber(first[2]) < nxt) then nxt = tonumber(first[2]) end
  end
  out[4] = nxt or 0
  if wait_ms > 0 and redis.call('PTTL', K.waiting) < wait_ms then
    redis.call('SET', K.waiting, 1, 'PX', wait_ms)
  end
end
out[1] = marks()
return out
