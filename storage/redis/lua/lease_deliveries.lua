-- lease_deliveries(KEYS=[the project's outbox]; ARGV=[prefix, now, lease_ms, limit])
--   -> {the outbox's earliest due time after the lease or -1 when empty,
--       {delivery id, {delivery field, value, ...}, {subscription field, value, ...} or {} when an earlier
--        entry of this reply has the same subscription's, {the indexes of the messages leased} or {} for a
--        delivery of one message or none}, ...}
-- Takes up to `limit` due deliveries of one project, oldest due first, each until now + lease_ms: in one
-- script, so two notifiers never hold one at once while its lease runs, and a notifier that dies holding one
-- leaves it due again when the lease ends (at least once). A post's delivery hash (lib.lua notify_post)
-- counts a delivery a message: the messages it owes that are due are leased, each on its own (up to the
-- limit), and the hash is due again at pack_next_due(). A delivery whose subscription is gone, expired, or
-- (for a notification) no longer confirmed is deleted instead.
local outbox, prefix, now = KEYS[1], ARGV[1], tonumber(ARGV[2])
local lease, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local owed = outbox_owed_key(prefix)
local out = {-1}
-- subscription id -> {its fields as a table, its HGETALL, whether a leased delivery carried them yet}: each
-- subscription read once a script, and sent once a reply, with the first live delivery that names it
local subs = {}
local function subscription(sid)
  local s = subs[sid]
  if s == nil then
    local all = redis.call('HGETALL', subscription_key(prefix, sid))
    local f = {}
    for i = 1, #all, 2 do f[all[i]] = all[i + 1] end
    s = {f, all, false}
    subs[sid] = s
  end
  return s
end
local taken, dropped = 0, false
for _, did in ipairs(redis.call('ZRANGEBYSCORE', outbox, '-inf', now, 'LIMIT', 0, limit)) do
  if taken >= limit then break end
  local dk = delivery_key(prefix, did)
  local all = redis.call('HGETALL', dk)
  local d = {}
  for i = 1, #all, 2 do d[all[i]] = all[i + 1] end
  local live = false
  if d._k then
    local s = subscription(d._s)
    local f = s[1]
    live = f.q == d._q and tonumber(f.e or 0) > now and (d._k ~= 'notification' or f.c == '1')
    if live then
      local leased = {}
      if d._p then
        local ends = {}
        for i = 1, pack_size(d) do
          if taken >= limit then break end
          local at = pack_due_at(d, i)
          if at and at <= now then
            table.insert(leased, i)
            table.insert(ends, '_d' .. i); table.insert(ends, now + lease)
            d['_d' .. i] = now + lease
            taken = taken + 1
          end
        end
        if #ends > 0 then redis.call('HSET', dk, unpack(ends)) end
        redis.call('ZADD', outbox, pack_next_due(d), did)
      else
        redis.call('ZADD', outbox, now + lease, did)
        taken = taken + 1
      end
      if not d._p or #leased > 0 then
        table.insert(out, {did, all, s[3] and {} or s[2], leased})
        s[3] = true
      end
    else
      redis.call('DECRBY', owed, tonumber(d._l) or 1)
    end
  end
  if not live then
    redis.call('DEL', dk)
    redis.call('ZREM', outbox, did)
    dropped = true
  end
end
if dropped then forget_owed_if_empty(outbox, owed) end
out[1] = outbox_first_due(outbox)
return out
