-- lib.lua: prepended to every script by scripts.py. Helpers only, and the SWEEP flag.
--
-- Key layout (storage/redis/keys.py builds the same names; prefix = "<ns>:{<project>}:"):
--   prefix.."queues"            ZSET  queue names of the project (score 0, listed by lex order)
--   prefix.."due"               ZSET  queue name -> ms, never later than the queue's next claim or message
--                                     expiry; the sweeper (sweep.lua) visits the queues that are due
--   prefix.."q:"..name          HASH  meta (JSON), created, seq, policy fields (dttl ddelay maxpost maxcc
--                                     dlq dlqttl), counters n_dl (dead-lettered out), n_disc, n_rcv (received)
--   prefix.."q:"..name..":msgs"     ZSET id -> marker      every live message of the queue (paging, FIFO)
--   prefix.."q:"..name..":ready"    ZSET id -> marker      claimable now
--   prefix.."q:"..name..":delayed"  ZSET id -> ms          not claimable before the score (delay)
--   prefix.."q:"..name..":claimed"  ZSET id -> ms          claimed until the score
--   prefix.."q:"..name..":expiry"   ZSET id -> ms          the message expires at the score
--   prefix.."m:"..id            HASH  q b t cr e k cl c ce cc av [dsrc drsn dcc dat dfirst]
--   prefix.."c:"..claim_id      HASH  q ttl grace cr e;  prefix.."c:"..claim_id..":m"  LIST of message ids
-- Every key shares the {project} hash tag, so a queue and its DLQ are in one cluster slot: a key derived
-- here from data (a DLQ name, a message id) stays in the slot of the KEYS the caller passed.
-- Invariant: a live message id is in msgs, in expiry, and in exactly one of ready / delayed / claimed.

local HOUSEKEEP_BATCH = 100
local GC_SLACK_MS = 300000  -- Redis drops a message hash this long after its logical expiry (memory only)

local function qkeys(prefix, name)
  local base = prefix .. 'q:' .. name
  return {name = name, queue = base, msgs = base .. ':msgs', ready = base .. ':ready',
          delayed = base .. ':delayed', claimed = base .. ':claimed', expiry = base .. ':expiry',
          queues = prefix .. 'queues', due = prefix .. 'due'}
end

-- Whether this script moved the project's earliest due time earlier. Scripts that can (post, claim,
-- renew, release) return it first, and the driver then marks the project touched for the sweeper, which
-- otherwise only looks at projects whose recorded due time has come. (Other scripts only schedule work
-- while handling work that was already due, so the sweeper visits their project anyway.)
local SWEEP = {lowered = 0}

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

local function set_expiry(K, mk, id, e, now)
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
  redis.call('DEL', prefix .. 'm:' .. id)
end

local function policy(K)
  local p = redis.call('HMGET', K.queue, 'maxcc', 'dlq', 'dlqttl')
  return {maxcc = tonumber(p[1]), dlq = p[2], dlqttl = tonumber(p[3])}
end

local function exhausted(pol, cc)
  return pol.maxcc ~= nil and cc >= pol.maxcc
end

-- Move message `id` of queue `name` to the policy's DLQ (returns 1), or discard it when the queue has no
-- DLQ (returns 0). One script, so a crash leaves it in exactly one queue (ARCHITECTURE.md §3 promise 1).
-- The moved message carries no claim, is claimable at once and gets a new marker in the DLQ.
local function dead_letter(prefix, K, name, id, reason, now, pol)
  local mk = prefix .. 'm:' .. id
  local f = redis.call('HMGET', mk, 'cc', 'cr', 'e', 'dfirst')
  unindex(K, id)
  if not pol.dlq then
    redis.call('DEL', mk)
    redis.call('HINCRBY', K.queue, 'n_disc', 1)
    return 0
  end
  local D = qkeys(prefix, pol.dlq)
  ensure_queue(D, pol.dlq, now)
  local k = redis.call('HINCRBY', D.queue, 'seq', 1)
  local e = tonumber(f[3])
  if pol.dlqttl then e = now + pol.dlqttl * 1000 end
  redis.call('HSET', mk, 'q', pol.dlq, 'k', k, 'c', '', 'ce', 0, 'cc', 0, 'av', now, 'cr', now,
             't', math.ceil((e - now) / 1000), 'dsrc', name, 'drsn', reason, 'dcc', f[1] or 0,
             'dat', now, 'dfirst', f[4] or f[2])
  set_expiry(D, mk, id, e, now)
  redis.call('ZADD', D.msgs, k, id)
  redis.call('ZADD', D.ready, k, id)
  redis.call('HINCRBY', K.queue, 'n_dl', 1)
  redis.call('HINCRBY', D.queue, 'n_rcv', 1)
  return 1
end

-- Return a message whose claim ended to the queue: ready again, or dead-lettered at once when it has
-- used up its claims (eager move, promise 7). Returns 'ready', 'moved' or 'discarded'.
local function unclaim(prefix, K, name, id, now, pol)
  local mk = prefix .. 'm:' .. id
  redis.call('ZREM', K.claimed, id)
  redis.call('HSET', mk, 'c', '', 'ce', 0)
  local f = redis.call('HMGET', mk, 'cc', 'k')
  if exhausted(pol, tonumber(f[1])) then
    if dead_letter(prefix, K, name, id, 'max_claims', now, pol) == 1 then return 'moved' end
    return 'discarded'
  end
  redis.call('ZADD', K.ready, f[2], id)
  return 'ready'
end

-- Bring the queue's indexes up to `now`, a bounded amount of work per call: drop expired messages, make
-- delayed messages whose delay ended ready, and end expired claims.
local function housekeep(prefix, K, name, now, pol)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.expiry, '-inf', now, 'LIMIT', 0, HOUSEKEEP_BATCH)) do
    remove_message(prefix, K, id)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.delayed, '-inf', now, 'LIMIT', 0, HOUSEKEEP_BATCH)) do
    redis.call('ZREM', K.delayed, id)
    local k = redis.call('HGET', prefix .. 'm:' .. id, 'k')
    if k then redis.call('ZADD', K.ready, k, id) else unindex(K, id) end
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.claimed, '-inf', now, 'LIMIT', 0, HOUSEKEEP_BATCH)) do
    if redis.call('EXISTS', prefix .. 'm:' .. id) == 1 then unclaim(prefix, K, name, id, now, pol)
    else unindex(K, id) end
  end
end

-- A live message of queue `name` as a flat field/value list with its id first, or nil.
local function view(prefix, name, id, now)
  local fields = redis.call('HGETALL', prefix .. 'm:' .. id)
  if #fields == 0 then return nil end
  local q, e
  for i = 1, #fields, 2 do
    if fields[i] == 'q' then q = fields[i + 1] elseif fields[i] == 'e' then e = tonumber(fields[i + 1]) end
  end
  if q ~= name or e <= now then return nil end
  table.insert(fields, 1, id)
  return fields
end

-- Queue scripts take KEYS = queue, msgs, ready, delayed, claimed, expiry, queues, due (keys.py QueueKeys
-- order) and ARGV = prefix, name, now, ... .
local function keys_from(ks, name)
  return {name = name, queue = ks[1], msgs = ks[2], ready = ks[3], delayed = ks[4], claimed = ks[5],
          expiry = ks[6], queues = ks[7], due = ks[8]}
end

local POLICY_FIELDS = {'dttl', 'ddelay', 'maxpost', 'maxcc', 'dlq', 'dlqttl'}

-- Write the metadata JSON and the policy fields parsed from it (ARGV from `first` on, '' = unset), if the
-- project's metadata version is still argv[first + 7] ('' = write regardless); bumps the version. The
-- version is project-wide because a DLQ cycle check reads several queues of the project.
local function write_metadata(prefix, K, argv, first)
  local expected = argv[first + 7]
  local mver = prefix .. 'mver'
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
