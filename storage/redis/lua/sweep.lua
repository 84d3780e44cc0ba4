-- sweep(KEYS=[the project's due], ARGV=[prefix, now, max_queues, the operator's DLQ defaults (lib.lua set_defaults)])
--   -> {queues visited, queues still due, the project's next due time or -1 when nothing is scheduled,
--       1 when a dead-letter move owed deliveries (lib.lua OUTBOX) else 0}
-- The background sweeper's step for one project: every queue whose due time has come is brought up to
-- now by housekeep() — an expired claim ends there, and a message that used up its claims moves to the
-- DLQ at that moment (docs/contract.md promise 7) — then rescheduled for its next claim or message
-- expiry, or unscheduled. Each queue is one atomic step, so any number of sweepers (API processes) may
-- run this at once: a message whose claim has already been ended is not in `claimed` any more, so no
-- message is moved twice. housekeep() is bounded, so a queue with a backlog stays due and is visited again.

-- When the sweeper must next visit the queue: its earliest claim or message expiry, or nil for never.
local function next_due(K)
  local at
  for _, index in ipairs({K.claimed, K.expiry}) do
    local first = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
    if #first == 2 and (at == nil or tonumber(first[2]) < at) then at = tonumber(first[2]) end
  end
  return at
end

local prefix, now, max_queues = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
set_defaults(ARGV, 4)
local due = KEYS[1]
-- A sweep frees memory, so it must run on a full Redis too (maxmemory, noeviction). Redis refuses a command
-- that may grow memory only before a script's first write (it never stops a script half-way): a first write
-- that removes nothing makes the rest of the sweep (its rescheduling ZADDs, DLQ moves) go through.
redis.call('ZREMRANGEBYSCORE', due, '+inf', '-inf')
local names = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, max_queues)
for _, name in ipairs(names) do
  local K = qkeys(prefix, name)
  if redis.call('EXISTS', K.queue) == 0 then
    redis.call('ZREM', due, name)
  else
    housekeep(prefix, K, name, now, policy(K))
    local at = next_due(K)
    if at then redis.call('ZADD', due, at, name) else redis.call('ZREM', due, name) end
  end
end
local first = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
return {#names, redis.call('ZCOUNT', due, '-inf', now), first[2] or -1, OUTBOX.owed}
