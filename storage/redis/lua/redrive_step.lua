-- redrive_step(KEYS=queue keys of the DLQ, task; ARGV=[queue script args, task_id, owner, lease_ms, batch,
--              at, upto, only])
--   -> {lib.lua marks(), status, cursor, scanned, moved, skipped, end, created, updated, spec, owner}
--   (the task as it is after the step), or error CHARON_NO_TASK.
-- One batch of a redrive task, done only while `owner` holds the task and it is running: looks at the next
-- `batch` messages of the DLQ after the task's cursor (up to its end marker) and moves each one that
-- matches the filters back to the task's destination, or to the queue it was dead-lettered from (skipped,
-- staying here, while that queue is at its `messages_per_queue` quota). Each move
-- and the task's progress are in this one script, so a task resumed after a crash moves nothing twice and
-- its counts are exact. A moved message gets a new marker in its destination, no claim, claim count 0, and
-- its provenance's redrive count goes up by one. Claimed messages, and ones with nowhere to go, are skipped.
-- A task of listed message ids looks up the next `batch` of its ids instead (its cursor and end count ids);
-- an id that is not a message of this DLQ (any more), or that was dead-lettered (again) after the task
-- began, is scanned and passed over.
-- A task with a signature filter ('fsig') moves only the ids in `only` (a JSON array): those of the next
-- messages its driver read from cursor `at` (or the next listed ids) and found of that signature. The step
-- does nothing unless the task's cursor is still `at`, and walks no further than `upto`, the last marker the
-- driver read ('': it read to the end), so no message is passed over unread.
local prefix, name, now, K = queue_script()
local owner, lease_ms, batch = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
local at, upto = tonumber(ARGV[11]), tonumber(ARGV[12])
local tk = KEYS[9]
local t = redis.call('HMGET', tk, 'q', 'status', 'owner', 'cursor', 'end', 'scanned', 'moved', 'skipped',
                     'dest', 'fsrc', 'frsn', 'fafter', 'fbefore', 'limit', 'cr', 'up', 'spec', 'fids', 'fsig',
                     'sigend')
if t[1] ~= name then return redis.error_reply('CHARON_NO_TASK No such redrive task on queue ' .. name .. '.') end
local status, cursor, last = t[2], tonumber(t[4]), tonumber(t[5])
local listed = t[18] and t[18] ~= ''
if listed then last = tonumber(t[18]) end  -- its end counts ids ('end' is 0: see task_create.lua)
if not listed and t[20] and t[20] ~= '' then last = tonumber(t[20]) end  -- a signature's walk: the same
local scanned, moved, skipped = tonumber(t[6]), tonumber(t[7]), tonumber(t[8])
local unchanged = {0, status, cursor, scanned, moved, skipped, last, t[15], t[16], t[17], t[3]}
if status ~= 'running' or t[3] ~= owner then return unchanged end
local only
if t[19] and t[19] ~= '' then  -- a signature filter: the ids the driver found of it, read from here
  if not at then return redis.error_reply('CHARON_NO_READ A signature filter needs what was read.') end
  if at ~= cursor then return unchanged end  -- another step came in between: the driver reads again
  only = {}
  local read = ARGV[13] or ''
  for _, id in ipairs(read ~= '' and cjson.decode(read) or {}) do only[id] = true end
end
local dest, fsrc, frsn = t[9], t[10], t[11]
local after, before, limit = tonumber(t[12]), tonumber(t[13]), tonumber(t[14])
housekeep(prefix, K, name, now, policy(K))

local function matches(id, f)
  if not f[4] then return false end  -- not a dead letter: nothing says where it came from
  if only and not only[id] then return false end
  if fsrc ~= '' and f[4] ~= fsrc then return false end
  if frsn ~= '' and f[5] ~= frsn then return false end
  local at = tonumber(f[6])
  if after and at < after then return false end
  if before and at >= before then return false end
  return true
end

local function redrive(id, to, f)
  local mk = message_key(prefix, id)
  local D = qkeys(prefix, to)
  unindex(K, id)
  ensure_queue(D, to, now)
  local k = redis.call('HINCRBY', D.queue, 'seq', 1)
  redis.call('HSET', mk, 'q', to, 'k', k, 'c', '', 'ce', 0, 'cc', 0, 'av', now,
             'drc', (tonumber(f[7]) or 0) + 1)
  redis.call('HDEL', mk, 'ccl')  -- a DLQ reader's claim is not the source queue's consumer
  set_expiry(D, mk, id, tonumber(f[1]), now)
  redis.call('ZADD', D.msgs, k, id)
  redis.call('ZADD', D.ready, k, id)
  woke(D.queue, 1)
  redis.call('HINCRBY', K.queue, 'n_rd', 1)
end

local created = tonumber(t[15])

-- Whether destination `to` has room for one more message (its `messages_per_queue` quota), counting the
-- moves of this step, and exists or may be made (the `queues` quota): a message for a full queue, or for
-- one the project may not make, is skipped and stays here.
local rooms = {}
local function has_room(to)
  if rooms[to] == nil then
    local D = qkeys(prefix, to)
    if queue_refused(prefix, D, to) then rooms[to] = 0 else rooms[to] = message_room(prefix, D, now) or false end
  end
  if rooms[to] == false then return true end
  if rooms[to] <= 0 then return false end
  rooms[to] = rooms[to] - 1
  return true
end

local function step(id)
  scanned = scanned + 1
  local f = redis.call('HMGET', message_key(prefix, id), 'e', 'c', 'ce', 'dsrc', 'drsn', 'dat', 'drc', 'q')
  if f[8] == name and f[1] and tonumber(f[1]) > now and matches(id, f)
     and not (listed and tonumber(f[6]) > created) then
    local to = dest ~= '' and dest or f[4]
    if (f[2] ~= '' and tonumber(f[3]) > now) or to == name or not has_room(to) then
      skipped = skipped + 1
    else
      redrive(id, to, f)
      moved = moved + 1
      if limit and moved >= limit then return true end
    end
  end
  return false
end

local looked
if listed then
  local ids = cjson.decode(t[17]).message_ids
  looked = 0
  for i = cursor + 1, math.min(cursor + batch, #ids) do
    cursor, looked = i, looked + 1
    if step(ids[i]) then break end
  end
  looked = looked * 2  -- as ZRANGEBYSCORE ... WITHSCORES counts below
else
  local to = (upto and upto < last) and upto or last
  local ids = redis.call('ZRANGEBYSCORE', K.msgs, '(' .. cursor, to, 'WITHSCORES', 'LIMIT', 0, batch)
  looked = #ids
  local stopped = false
  for i = 1, #ids, 2 do
    cursor = tonumber(ids[i + 1])
    if step(ids[i]) then stopped = true break end
  end
  if to < last and looked < 2 * batch and not stopped then  -- all read up to `upto`: the next step goes on
    cursor, looked = to, 2 * batch
  end
end
if looked < 2 * batch or (limit and moved >= limit) or cursor >= last then status = 'succeeded' end
redis.call('HSET', tk, 'status', status, 'cursor', cursor, 'scanned', scanned, 'moved', moved,
           'skipped', skipped, 'up', now, 'lease', now + lease_ms)
if status ~= 'running' then redis.call('PEXPIRE', tk, TASK_KEEP_MS) end
return {marks(), status, cursor, scanned, moved, skipped, last, t[15], now, t[17], owner}
