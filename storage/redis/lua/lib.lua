-- lib.lua: the part of it a script uses is prepended to the script by scripts.py (used()). Helpers only, and
-- the SWEEP flag.
--
-- The layout (every key and hash field name) is storage/redis/keys.py's: a script gets the keys its caller
-- knows in KEYS, and derives here only those it finds in data (a DLQ's keys from the queue's policy, a
-- message's hash from an id in an index), with qkeys() and message_key() below, which
-- tests/storage/test_layout.py holds to keys.py, as it holds every hash field name in these files.
-- Every key shares the {project} hash tag, so a queue and its DLQ are in one cluster slot: a key derived
-- here from data stays in the slot of the KEYS the caller passed.
-- Invariant: a live message id is in msgs, in expiry, and in exactly one of ready / delayed / claimed.

local HOUSEKEEP_BATCH = 100
local GC_SLACK_MS = 300000  -- Redis drops a message hash this long after its logical expiry (memory only)
local TASK_KEEP_MS = 7 * 86400000  -- a finished redrive task's record is kept this long

-- keys.py QueueKeys.notify, .subscriptions and .subscribers, from a queue's key
local function notify_key(queue_key)
  return queue_key .. ':notify'
end

local function subscriptions_key(queue_key)
  return queue_key .. ':subs'
end

local function subscribers_key(queue_key)
  return queue_key .. ':subscribers'
end

-- keys.py QueueKeys / ProjectKeys.message
-- keys.py ProjectKeys.message_expiry and .message_sizes (the `message_bytes` quota: see count_bytes)
local function message_expiry_key(prefix) return prefix .. 'bytes' end
local function message_sizes_key(prefix) return prefix .. 'sizes' end

local function qkeys(prefix, name)
  local base = prefix .. 'q:' .. name
  return {name = name, queue = base, msgs = base .. ':msgs', ready = base .. ':ready',
          delayed = base .. ':delayed', claimed = base .. ':claimed', expiry = base .. ':expiry',
          queues = prefix .. 'queues', due = prefix .. 'due', notify = notify_key(base),
          bytes = message_expiry_key(prefix), sizes = message_sizes_key(prefix),
          subs = subscriptions_key(base), subscribers = subscribers_key(base)}
end

-- keys.py ProjectKeys.subscription, .delivery, .outbox, .outbox_seq and .outbox_owed
local function subscription_key(prefix, sid)
  return prefix .. 's:' .. sid
end

local function delivery_key(prefix, did)
  return prefix .. 'd:' .. did
end

local function outbox_key(prefix)
  return prefix .. 'outbox'
end

local function outbox_seq_key(prefix)
  return prefix .. 'outbox:seq'
end

local function outbox_owed_key(prefix)
  return prefix .. 'outbox:owed'
end

local function message_key(prefix, id)
  return prefix .. 'm:' .. id
end

-- keys.py QueueKeys.waiting and .wake_channel, from a queue's key
local function waiting_key(queue_key)
  return queue_key .. ':waiting'
end

local function wake_channel(queue_key)
  return queue_key .. ':wake'
end


-- Whether this script moved the project's earliest due time earlier. Scripts that can (post, claim,
-- renew, release) return it first, and the driver then marks the project touched for the sweeper, which
-- otherwise only looks at projects whose recorded due time has come. (Other scripts only schedule work
-- while handling work that was already due, so the sweeper visits their project anyway.)
local SWEEP = {lowered = 0}

-- Whether this script wrote deliveries to the project's outbox (owe()). Scripts return marks() first:
-- 1 = the due time moved earlier, 2 = deliveries owed, and the driver then marks the project for the
-- sweeper or the notifier.
local OUTBOX = {owed = 0}

local function marks()
  return SWEEP.lowered + 2 * OUTBOX.owed
end

-- Owe subscription `sid` a delivery of `kind` ('notification', 'confirmation', 'unsubscribed') in the
-- project's outbox, due now: the delivery hash holds the kind, the subscription, the queue, no failed
-- attempts yet, when it was written, and for a notification the message's id and every field of its hash as
-- it is now (the message as posted or dead-lettered, provenance with it), so that consuming the message does
-- not take the notification with it. One script writes the cause and the delivery: neither goes alone.
local function owe(prefix, sid, kind, queue, now, id, fields)
  local did = redis.call('INCR', outbox_seq_key(prefix))
  local dk = delivery_key(prefix, did)
  if id then
    -- one HSET: the delivery's own fields first, then the message's (at most ~30, well inside unpack's bound)
    redis.call('HSET', dk, '_k', kind, '_s', sid, '_q', queue, '_a', 0, '_cr', now, '_m', id, unpack(fields))
  else
    redis.call('HSET', dk, '_k', kind, '_s', sid, '_q', queue, '_a', 0, '_cr', now)
  end
  redis.call('ZADD', outbox_key(prefix), now, did)
  redis.call('INCR', outbox_owed_key(prefix))
  OUTBOX.owed = 1
end

-- keys.py ProjectKeys.subscription_expiry: each subscription of the project by its expiry (the
-- `subscriptions` quota counts the live ones)
local function subscription_expiry_key(prefix) return prefix .. 'subs' end

-- Delete subscription `sid` of queue K and its indexes (what it is still owed is dropped when leased).
local function remove_subscription(prefix, K, sid)
  local sk = subscription_key(prefix, sid)
  local subscriber = redis.call('HGET', sk, 's')
  if subscriber and redis.call('HGET', K.subscribers, subscriber) == sid then
    redis.call('HDEL', K.subscribers, subscriber)
  end
  redis.call('DEL', sk)
  redis.call('ZREM', K.subs, sid)
  redis.call('ZREM', K.notify, sid)
  redis.call('ZREM', subscription_expiry_key(prefix), sid)
end

-- Delete the subscriptions of queue K whose ttl has run out (all of them when `all`). A queue has at most
-- CHARON_LIMITS__MAX_SUBSCRIPTIONS_PER_QUEUE (1,000 at most), so this is bounded.
local function drop_subscriptions(prefix, K, now, all)
  for _, sid in ipairs(redis.call('ZRANGE', K.subs, 0, -1)) do
    local e = tonumber(redis.call('HGET', subscription_key(prefix, sid), 'e'))
    if all or e == nil or e <= now then remove_subscription(prefix, K, sid) end
  end
end

-- The live subscription `sid` of queue K (its hash key), or nil.
local function live_subscription(prefix, K, sid, now)
  local sk = subscription_key(prefix, sid)
  local f = redis.call('HMGET', sk, 'q', 'e')
  if f[1] ~= K.name or tonumber(f[2]) <= now then return nil end
  return sk
end

-- The live confirmed subscriptions of queue K (K.notify: sid -> its expiry). A queue nobody subscribed to
-- costs one ZRANGEBYSCORE of a missing key.
local function subscribers(K, now)
  return redis.call('ZRANGEBYSCORE', K.notify, '(' .. now, '+inf')
end

-- Owe each of `subs` (subscribers(K, now)) a notification of message `id` (hash `mk`) of queue K, with every
-- field of the message as it is now (a dead letter's provenance with it).
local function notify(prefix, K, subs, id, mk, now)
  if #subs == 0 then return end
  local fields = redis.call('HGETALL', mk)
  for _, sid in ipairs(subs) do owe(prefix, sid, 'notification', K.name, now, id, fields) end
end

-- Owe each of `subs` (subscribers(K, now)) a notification of each message of a post, in ONE delivery hash
-- per subscription and POST_PACK messages: `owed` is the flat list id, ttl, eligible 1/0, body of each
-- message, packed in the hash as a notification shows them (`_p`: the same, US-separated, US = "\31";
-- storage/redis/outbox.py reads it and fills in the rest: not claimed, never claimed), with `_n` how many
-- and `_l` how many are still owed. Each message keeps its own state in the hash (pack_next_due below): a
-- lease takes messages, not hashes, and each is finished on its own (finish_delivery.lua); the hash goes
-- with the last. A post of up to POST_PACK messages costs two INCRBYs, one ZADD and one HSET a subscription
-- (a hash a message cost redis-server twice the post's own work).
local POST_PACK = 32

local function notify_post(prefix, K, subs, owed, now)
  local n = #owed / 4
  if #subs == 0 or n == 0 then return end
  local packs = {}
  for first = 1, n, POST_PACK do
    local last = math.min(first + POST_PACK - 1, n)
    table.insert(packs, {last - first + 1, table.concat(owed, '\31', 4 * first - 3, 4 * last)})
  end
  local count = #subs * #packs
  local did = redis.call('INCRBY', outbox_seq_key(prefix), count) - count
  local due = {}
  for _, sid in ipairs(subs) do
    for _, pack in ipairs(packs) do
      did = did + 1
      redis.call('HSET', delivery_key(prefix, did), '_k', 'notification', '_s', sid, '_q', K.name, '_a', 0,
                 '_cr', now, '_n', pack[1], '_l', pack[1], '_p', pack[2])
      table.insert(due, now); table.insert(due, did)
    end
  end
  local outbox = outbox_key(prefix)
  for first = 1, #due, 2000 do
    redis.call('ZADD', outbox, unpack(due, first, math.min(first + 1999, #due)))
  end
  redis.call('INCRBY', outbox_owed_key(prefix), #subs * n)
  OUTBOX.owed = 1
end

-- How many messages a post's hash holds (`_n`; counted in `_p` for a hash written before `_n` existed).
local function pack_size(d)
  return tonumber(d._n) or (select(2, string.gsub(d._p, '\31', '')) + 1) / 4
end

-- A post's hash's state, without its packed messages: `_n`, `_l`, `_cr`, and `_x<i>`, `_d<i>` of each.
local function pack_state(dk)
  local head = redis.call('HMGET', dk, '_n', '_l', '_cr')
  local n = tonumber(head[1]) or pack_size({_p = redis.call('HGET', dk, '_p')})
  local d = {_n = n, _l = head[2], _cr = head[3]}
  local names = {}
  for i = 1, n do table.insert(names, '_x' .. i); table.insert(names, '_d' .. i) end
  local values = redis.call('HMGET', dk, unpack(names))
  for i = 1, #names do
    if values[i] then d[names[i]] = values[i] end
  end
  return d
end

-- A post's delivery hash (notify_post), its fields as a table `d`: message i (1..pack_size) is owed until
-- `_x<i>` is set, and due at `_d<i>` (unset: at `_cr`; a lease sets it to the lease's end, a retry to its
-- time); `_a<i>` counts its failed attempts. pack_due_at: when message i is due, nil once finished.
local function pack_due_at(d, i)
  if d['_x' .. i] then return nil end
  return tonumber(d['_d' .. i] or d._cr)
end

-- The hash's outbox score: the earliest due time of the messages it still owes (nil when it owes none).
local function pack_next_due(d)
  local first
  for i = 1, pack_size(d) do
    local at = pack_due_at(d, i)
    if at and (first == nil or at < first) then first = at end
  end
  return first
end

-- The outbox's earliest due time, or -1 when it is empty (what the notifier scripts return).
local function outbox_first_due(outbox)
  local first = redis.call('ZRANGE', outbox, 0, 0, 'WITHSCORES')
  return #first == 2 and first[2] or -1
end

-- After a script deleted deliveries: an empty outbox owes nothing, so its count starts again from 0 (a count
-- that drifted, e.g. hashes written before the count existed, heals once the outbox runs dry).
local function forget_owed_if_empty(outbox, owed)
  if redis.call('ZCARD', outbox) == 0 then redis.call('DEL', owed) end
end

-- Wake-ups for long polls (POST .../claims?wait=S). A claim that found nothing and will wait sets the queue's
-- `waiting` flag (keys.py QueueKeys.waiting; it expires after the wait); a script that makes messages of a
-- queue claimable (now or later) counts them with woke(), and scripts.py ends every script with
-- publish_wakes(), which PUBLISHes the count on the queue's channel (QueueKeys.wake_channel) only when the
-- flag is set: with nobody waiting, a post costs one EXISTS more.
local WOKEN = {}

local function woke(queue_key, n)
  WOKEN[queue_key] = (WOKEN[queue_key] or 0) + n
end

local function publish_wakes()
  for queue_key, n in pairs(WOKEN) do
    if redis.call('EXISTS', waiting_key(queue_key)) == 1 then
      redis.call('PUBLISH', wake_channel(queue_key), n)
    end
  end
end

-- Something happens to the queue at `at` (a claim or a message expires): make sure the sweeper visits it
-- by then. LT keeps the earliest time; an early visit only reschedules (sweep.lua).
local function schedule(K, at)
  if SWEEP.lowered == 0 then
    local first = redis.call('ZRANGE', K.due, 0, 0, 'WITHSCORES')
    if #first == 0 or at < tonumber(first[2]) then SWEEP.lowered = 1 end
  end
  redis.call('ZADD', K.due, 'LT', at, K.name)
end

local function ensure_queue(K, name, now)
  if redis.call('HSETNX', K.queue, 'created', now) == 1 then
    redis.call('ZADD', K.queues, 0, name)
    return 1
  end
  return 0
end

-- The project's message bytes (quota `message_bytes`): keys.py ProjectKeys.message_expiry (ZSET id ->
-- expiry ms, K.bytes) and .message_sizes (HASH id -> body bytes as stored, and field '' their sum, K.sizes).
-- Every message is in both from its post (count_bytes) until it is removed (forget_bytes), and expired ones
-- leave when the quota is counted (held_bytes), so the sum is then the live bodies' bytes. The sum is a kept
-- counter, changed in the same script as the entries it adds up.
local BYTES_SUM = ''

local function forget_bytes(K, ids)
  local sum = 0
  for first = 1, #ids, 1000 do
    local last = math.min(first + 999, #ids)
    for _, z in ipairs(redis.call('HMGET', K.sizes, unpack(ids, first, last))) do
      sum = sum + (tonumber(z) or 0)
    end
    redis.call('HDEL', K.sizes, unpack(ids, first, last))
    redis.call('ZREM', K.bytes, unpack(ids, first, last))
  end
  if sum > 0 then redis.call('HINCRBY', K.sizes, BYTES_SUM, -sum) end
end

-- The bytes of the project's live messages (forgets those expired first, at most FORGET_BATCH a call, so a
-- mass expiry costs each later count a bounded share: until they are all forgotten, the rest still count).
local FORGET_BATCH = 10000

local function held_bytes(K, now)
  local expired = redis.call('ZRANGEBYSCORE', K.bytes, '-inf', now, 'LIMIT', 0, FORGET_BATCH)
  if #expired > 0 then forget_bytes(K, expired) end
  return tonumber(redis.call('HGET', K.sizes, BYTES_SUM)) or 0
end

local function set_expiry(K, mk, id, e, now)
  if redis.call('ZADD', K.bytes, e, id) == 1 then  -- counted again (it expired into its DLQ), or at last
    local size = redis.call('HSTRLEN', mk, 'b')
    redis.call('HSET', K.sizes, id, size)
    redis.call('HINCRBY', K.sizes, BYTES_SUM, size)
  end
  redis.call('HSET', mk, 'e', e)
  redis.call('ZADD', K.expiry, e, id)
  schedule(K, e)
  redis.call('PEXPIRE', mk, math.max(e - now, 0) + GC_SLACK_MS)
end

local function unindex(K, id)
  redis.call('ZREM', K.msgs, id)
  redis.call('ZREM', K.ready, id)
  redis.call('ZREM', K.delayed, id)
  redis.call('ZREM', K.claimed, id)
  redis.call('ZREM', K.expiry, id)
end

local function remove_message(prefix, K, id)
  unindex(K, id)
  forget_bytes(K, {id})
  redis.call('DEL', message_key(prefix, id))
end

-- `cmd key item1 item2 ...` over all of `items`, `width` items per member (ZADD: 2), 1,000 members a call:
-- one call for a batch instead of one a member, and unpack() is bound by Lua's stack. `key` nil: the items
-- are the keys (DEL).
local function call_all(cmd, key, items, width)
  local step = 1000 * (width or 1)
  for first = 1, #items, step do
    if key then
      redis.call(cmd, key, unpack(items, first, math.min(first + step - 1, #items)))
    else
      redis.call(cmd, unpack(items, first, math.min(first + step - 1, #items)))
    end
  end
end

local function zadd_all(key, pairs) call_all('ZADD', key, pairs, 2) end

-- A post's messages into the project's message bytes (above): their expiry and size pairs, and `sum`.
local function count_bytes(K, expiry_pairs, size_pairs, sum)
  zadd_all(K.bytes, expiry_pairs)
  call_all('HSET', K.sizes, size_pairs, 2)
  redis.call('HINCRBY', K.sizes, BYTES_SUM, sum)
end

-- remove_message of each of `ids`, one call an index and one DEL for them all.
local function remove_messages(prefix, K, ids)
  if #ids == 0 then return end
  for _, index in ipairs({K.msgs, K.ready, K.delayed, K.claimed, K.expiry}) do call_all('ZREM', index, ids) end
  forget_bytes(K, ids)
  local keys = {}
  for i, id in ipairs(ids) do keys[i] = message_key(prefix, id) end
  call_all('DEL', nil, keys)
end

-- The operator's dead-letter defaults (core.metadata.DeadLetterDefaults, passed by every script that reads
-- a policy: see set_defaults): a max claim count for a queue without _max_claim_count, and the DLQ
-- prefix..name..suffix for a queue without _dead_letter_queue; a queue whose name fits that pattern is
-- such a DLQ and gets neither. tests/storage/test_layout.py holds policy() to DeadLetterDefaults.apply.
local DEFAULTS = {}

local function set_defaults(argv, first)
  local prefix, suffix = argv[first + 1], argv[first + 2]
  DEFAULTS.maxcc = tonumber(argv[first])
  -- then the counted quotas' defaults (core.quotas.Counted), taken out of ARGV so that each script's own
  -- arguments stay where its header says
  DEFAULTS.queues = tonumber(table.remove(argv, first + 3))
  DEFAULTS.messages_per_queue = tonumber(table.remove(argv, first + 3))
  DEFAULTS.subscriptions = tonumber(table.remove(argv, first + 3))
  DEFAULTS.message_bytes = tonumber(table.remove(argv, first + 3))
  if prefix ~= '' or suffix ~= '' then DEFAULTS.prefix, DEFAULTS.suffix = prefix, suffix end
end

-- Counted quotas (core/quotas.py; their names are core's): the project's override (keys.py
-- ProjectKeys.quota), else the operator's default (set_defaults), nil for none. Counted from the indexes
-- themselves: the project's queues (K.queues) and a queue's live messages (K.expiry after now, which holds
-- every message id: expired ones not yet swept do not count), so no counter can drift; message bytes from
-- the project's sizes (held_bytes), whose sum every script that adds or removes a message keeps.
local function quota_key(prefix) return prefix .. 'quota' end

local function counted_quota(prefix, name)
  local v = redis.call('HGET', quota_key(prefix), name)
  if v then return tonumber(v) end
  return DEFAULTS[name]
end

local function live_messages(K, now)
  return redis.call('ZCOUNT', K.expiry, '(' .. now, '+inf')
end

-- The refusal of a change past quota `name` (core.quotas.exceeded_reply reads it): `where` holds `use`.
local function over_quota(name, use, adding, limit, where)
  -- %.0f: Lua writes a number of 10^14 or more as "1e+14" (message_bytes goes to 10^15)
  local numbers = string.format('%.0f %.0f %.0f', use, adding, limit)
  return redis.error_reply('CHARON_QUOTA ' .. name .. ' ' .. numbers .. ' ' .. where)
end

-- Before queue K (`name`) is created by a caller's request (not by a move), with the DLQ `dlq` a metadata
-- write names (nil: none): its refusal when those of them that do not exist yet would take the project past
-- its `queues` quota, else nil. Scripts call it before they write anything.
local function queue_refused(prefix, K, name, dlq)
  local adding = 1 - redis.call('HEXISTS', K.queue, 'created')
  if dlq and dlq ~= name then adding = adding + 1 - redis.call('HEXISTS', qkeys(prefix, dlq).queue, 'created') end
  if adding == 0 then return nil end
  local limit = counted_quota(prefix, 'queues')
  if not limit then return nil end
  local n = redis.call('ZCARD', K.queues)
  if n + adding > limit then return over_quota('queues', n, adding, limit, 'This project') end
  return nil
end

-- Room queue K has for messages under its `messages_per_queue` quota (nil: no limit), the quota, and what
-- the queue holds.
local function message_room(prefix, K, now)
  local limit = counted_quota(prefix, 'messages_per_queue')
  if not limit then return nil, nil, nil end
  local n = live_messages(K, now)
  return math.max(limit - n, 0), limit, n
end

-- Its refusal when `adding` more bytes would take the project past its `message_bytes` quota, else nil.
local function bytes_refused(prefix, K, adding, now)
  local limit = counted_quota(prefix, 'message_bytes')
  if not limit then return nil end
  local held = held_bytes(K, now)
  if held + adding > limit then return over_quota('message_bytes', held, adding, limit, 'This project') end
  return nil
end

local function is_auto_dlq(name)
  local p, s = DEFAULTS.prefix, DEFAULTS.suffix
  if p == nil then return false end
  return #name >= #p + #s and name:sub(1, #p) == p and (s == '' or name:sub(-#s) == s)
end

local function split_numbers(text)
  local out = {}
  for v in string.gmatch(text, '[^,]+') do table.insert(out, tonumber(v)) end
  return out
end

local function policy(K)
  local p = redis.call('HMGET', K.queue, 'maxcc', 'dlq', 'dlqttl', 'rdelay', 'rmult', 'rmax', 'rjit',
                       'rlevels', 'expttl')
  local pol = {maxcc = tonumber(p[1]), dlq = p[2] or nil, dlqttl = tonumber(p[3]), rdelay = tonumber(p[4]),
               rmult = tonumber(p[5]) or 1, rmax = tonumber(p[6]) or 0, rjit = tonumber(p[7]) or 0,
               expttl = tonumber(p[9])}
  if p[8] then pol.rlevels = split_numbers(p[8]) end
  if not is_auto_dlq(K.name) then
    if pol.maxcc == nil then pol.maxcc = DEFAULTS.maxcc end
    if pol.dlq == nil and DEFAULTS.prefix ~= nil then
      local p, s = DEFAULTS.prefix, DEFAULTS.suffix
      pol.dlq = p .. K.name:sub(1, 64 - #p - #s) .. s
    end
  end
  return pol
end

-- core.metadata.jitter_unit: a number in [0, 1) for the n-th wait of message `id`.
local function jitter_unit(id, n)
  return ((tonumber(id:sub(1, 8), 16) + n * 2654435761) % 4294967296) / 4294967296
end

-- core.metadata.Backoff.wait_ms: how long message `id` waits after its n-th claim ends (ms).
local function backoff_ms(pol, id, n)
  if n < 1 then n = 1 end
  local wait
  if pol.rlevels then
    wait = pol.rlevels[math.min(n, #pol.rlevels)]
  elseif pol.rdelay and pol.rdelay > 0 then
    wait = math.min(pol.rdelay * pol.rmult ^ (n - 1), pol.rmax)
  else
    return 0
  end
  if pol.rjit > 0 then wait = wait * (1 + pol.rjit * (2 * jitter_unit(id, n) - 1)) end
  return math.floor(wait)
end

-- core.metadata.QueuePolicy.exhausted
local function exhausted(pol, cc)
  return pol.maxcc ~= nil and cc >= pol.maxcc
end

-- Move message `id` of queue `name` to the policy's DLQ (returns 1), or discard it when the queue has no
-- DLQ or the message is not DLQ-eligible (returns 0). One script, so a crash leaves it in exactly one queue
-- (docs/contract.md promise 1). The moved message carries no claim, is claimable at once and gets a new
-- marker in the DLQ. Its ttl there: the DLQ ttl if set (for reason 'expired': pol.expttl), else what was
-- left of it. `rejection` ({reason, description}, '' = not given) is the consumer's text for 'rejected'.
local DL_COUNTERS = {max_claims = 'n_dl_mc', expired = 'n_dl_exp', rejected = 'n_dl_rej'}

local function dead_letter(prefix, K, name, id, reason, now, pol, rejection, consumer)
  local mk = message_key(prefix, id)
  local f = redis.call('HMGET', mk, 'cc', 'cr', 'e', 'dfirst', 'ne', 'ccl')
  unindex(K, id)
  if not pol.dlq or f[5] == '1' then
    forget_bytes(K, {id})
    redis.call('DEL', mk)
    redis.call('HINCRBY', K.queue, 'n_disc', 1)
    return 0
  end
  local D = qkeys(prefix, pol.dlq)
  local room = message_room(prefix, D, now)
  if room == 0 then  -- a full DLQ: as having none (a move may not fail)
    forget_bytes(K, {id})
    redis.call('DEL', mk)
    redis.call('HINCRBY', K.queue, 'n_disc', 1)
    return 0
  end
  ensure_queue(D, pol.dlq, now)
  local k = redis.call('HINCRBY', D.queue, 'seq', 1)
  local e = tonumber(f[3])
  if reason == 'expired' then e = now + (pol.expttl or 0) * 1000
  elseif pol.dlqttl then e = now + pol.dlqttl * 1000 end
  redis.call('HDEL', mk, 'drr', 'drd', 'dcl', 'ccl')
  if not consumer or consumer == '' then consumer = f[6] end
  if consumer and consumer ~= '' then redis.call('HSET', mk, 'dcl', consumer) end
  redis.call('HSET', mk, 'q', pol.dlq, 'k', k, 'c', '', 'ce', 0, 'cc', 0, 'av', now, 'cr', now,
             't', math.ceil((e - now) / 1000), 'dsrc', name, 'drsn', reason, 'dcc', f[1] or 0,
             'dat', now, 'dfirst', f[4] or f[2])
  if rejection then
    if rejection[1] ~= '' then redis.call('HSET', mk, 'drr', rejection[1]) end
    if rejection[2] ~= '' then redis.call('HSET', mk, 'drd', rejection[2]) end
  end
  set_expiry(D, mk, id, e, now)
  redis.call('ZADD', D.msgs, k, id)
  redis.call('ZADD', D.ready, k, id)
  woke(D.queue, 1)
  redis.call('HINCRBY', K.queue, 'n_dl', 1)
  redis.call('HINCRBY', K.queue, DL_COUNTERS[reason], 1)
  redis.call('HINCRBY', D.queue, 'n_rcv', 1)
  notify(prefix, D, subscribers(D, now), id, mk, now)
  return 1
end

-- Return a message whose claim ended (at `ended`) to the queue: claimable again after its redelivery
-- wait (`wait_ms`, or the policy's backoff when nil), or dead-lettered at once when it has used up its
-- claims (eager move, promise 7). Returns 'ready', 'delayed', 'moved' or 'discarded'. With `batch`, its
-- claimed and ready index changes wait for unclaimed(K, batch).
local function unclaim(prefix, K, name, id, now, pol, ended, wait_ms, batch)
  local mk = message_key(prefix, id)
  if batch then table.insert(batch.unheld, id) else redis.call('ZREM', K.claimed, id) end
  redis.call('HSET', mk, 'c', '', 'ce', 0)
  local f = redis.call('HMGET', mk, 'cc', 'k')
  local cc = tonumber(f[1])
  if exhausted(pol, cc) then
    if dead_letter(prefix, K, name, id, 'max_claims', now, pol) == 1 then return 'moved' end
    return 'discarded'
  end
  local av = ended + (wait_ms or backoff_ms(pol, id, cc))
  woke(K.queue, 1)
  if av > now then
    redis.call('HSET', mk, 'av', av)
    redis.call('ZADD', K.delayed, av, id)
    return 'delayed'
  end
  if batch then
    table.insert(batch.ready, f[2]); table.insert(batch.ready, id)
  else
    redis.call('ZADD', K.ready, f[2], id)
  end
  return 'ready'
end

-- unclaim() of many messages with one `batch` (unclaim_batch()): their index changes are made here, one
-- call an index for them all, instead of two calls a message.
local function unclaim_batch() return {unheld = {}, ready = {}} end

local function unclaimed(K, batch)
  call_all('ZREM', K.claimed, batch.unheld)
  zadd_all(K.ready, batch.ready)
end

-- Whether claim hash `ck` is a live claim of queue `name`: made on this queue (not on one deleted since, of
-- the same name: its `qc`, the queue's `created` then, must be the queue's now) and not expired. A claim
-- written before `qc` was kept has none, and is this queue's while the queue exists. (A queue deleted and
-- made again within one millisecond would pass for the old one: its old claims would read as holding
-- nothing, which they do.)
local function live_claim(K, ck, name, now)
  local c = redis.call('HMGET', ck, 'q', 'e', 'qc')
  if c[1] ~= name or tonumber(c[2]) <= now then return false end
  local created = redis.call('HGET', K.queue, 'created')
  return created and (not c[3] or c[3] == '' or c[3] == created)
end

local function no_claim(claim_id)
  return redis.error_reply('CHARON_NO_CLAIM Claim ' .. claim_id .. ' does not exist or has expired.')
end

-- Whether message `id` (hash `mk`) is held by claim `claim_id`, for release_message and dead_letter_message:
-- errors CHARON_NO_MESSAGE (no such live message in the queue) or CHARON_CLAIM_MISMATCH (the claim does not
-- hold it now).
local function check_held(mk, name, id, claim_id, now)
  local f = redis.call('HMGET', mk, 'q', 'e', 'c', 'ce')
  if f[1] ~= name or tonumber(f[2]) <= now then
    return redis.error_reply('CHARON_NO_MESSAGE Message ' .. id .. ' does not exist in queue ' .. name .. '.')
  end
  if f[3] ~= claim_id or tonumber(f[4]) <= now then
    return redis.error_reply('CHARON_CLAIM_MISMATCH Claim ' .. claim_id .. ' does not hold message ' .. id ..
      ' (the claim has expired or another claim holds the message).')
  end
  return nil
end

-- Bring the queue's indexes up to `now`, a bounded amount of work per call: drop expired messages, make
-- delayed messages whose delay ended ready, and end expired claims.
local function housekeep(prefix, K, name, now, pol)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.expiry, '-inf', now, 'LIMIT', 0, HOUSEKEEP_BATCH)) do
    if pol.expttl and redis.call('EXISTS', message_key(prefix, id)) == 1 then
      dead_letter(prefix, K, name, id, 'expired', now, pol)
    else
      remove_message(prefix, K, id)
    end
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.delayed, '-inf', now, 'LIMIT', 0, HOUSEKEEP_BATCH)) do
    redis.call('ZREM', K.delayed, id)
    local k = redis.call('HGET', message_key(prefix, id), 'k')
    if k then redis.call('ZADD', K.ready, k, id) else unindex(K, id) end
  end
  local lapsed = redis.call('ZRANGEBYSCORE', K.claimed, '-inf', now, 'WITHSCORES', 'LIMIT', 0, HOUSEKEEP_BATCH)
  for i = 1, #lapsed, 2 do
    local id = lapsed[i]
    if redis.call('EXISTS', message_key(prefix, id)) == 1 then
      unclaim(prefix, K, name, id, now, pol, tonumber(lapsed[i + 1]))
    else unindex(K, id) end
  end
end

-- A live message of queue `name` (id `id`, hash `mk`) as a flat field/value list with its id first, or nil.
local function view(mk, name, id, now)
  local fields = redis.call('HGETALL', mk)
  if #fields == 0 then return nil end
  local q, e
  for i = 1, #fields, 2 do
    if fields[i] == 'q' then q = fields[i + 1] elseif fields[i] == 'e' then e = tonumber(fields[i + 1]) end
  end
  if q ~= name or e <= now then return nil end
  table.insert(fields, 1, id)
  return fields
end

-- A queue script takes KEYS = queue, msgs, ready, delayed, claimed, expiry, queues, due (keys.py
-- QueueKeys.all order), then its own, and ARGV = prefix, name, now, the operator's DLQ defaults (three:
-- set_defaults), then its own (from ARGV[7]). Returns prefix, name, now and the queue's keys.
local function queue_script()
  set_defaults(ARGV, 4)
  local ks, name = KEYS, ARGV[2]
  return ARGV[1], name, tonumber(ARGV[3]),
    {name = name, queue = ks[1], msgs = ks[2], ready = ks[3], delayed = ks[4], claimed = ks[5],
     expiry = ks[6], queues = ks[7], due = ks[8], waiting = waiting_key(ks[1]),
     notify = notify_key(ks[1]), subs = subscriptions_key(ks[1]), subscribers = subscribers_key(ks[1]),
     bytes = message_expiry_key(ARGV[1]), sizes = message_sizes_key(ARGV[1])}
end

-- The policy's field names, in ARGV order: scripts.py writes core.metadata.POLICY_FIELDS into the braces
-- when it loads the scripts (a reserved key's row names its field; nothing here lists them).
local POLICY_FIELDS = {--[[POLICY_FIELDS]]}

-- Policy field `field` among a metadata write's arguments (ARGV from `first` on, as write_metadata takes
-- them), or nil when unset.
local function policy_arg(argv, first, field)
  for i, f in ipairs(POLICY_FIELDS) do
    if f == field then
      local v = argv[first + i]
      if v ~= '' then return v end
      return nil
    end
  end
  return nil
end

-- Write the metadata JSON and the policy fields parsed from it (ARGV from `first` on, '' = unset), if the
-- project's metadata version (key `mver`) is still the argument after them ('' = write regardless); bumps
-- the version. The version is project-wide because a DLQ cycle check reads several queues of the project.
local function write_metadata(mver, K, argv, first)
  local expected = argv[first + #POLICY_FIELDS + 1]
  if expected and expected ~= '' and tonumber(redis.call('GET', mver) or '0') ~= tonumber(expected) then
    return false
  end
  redis.call('INCR', mver)
  redis.call('HSET', K.queue, 'meta', argv[first])
  for i, field in ipairs(POLICY_FIELDS) do
    local v = argv[first + i]
    if v == '' then redis.call('HDEL', K.queue, field) else redis.call('HSET', K.queue, field, v) end
  end
  return true
end

local STALE = 'CHARON_STALE The queue metadata of this project changed meanwhile; read it again.'
