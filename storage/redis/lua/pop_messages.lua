-- pop_messages(KEYS=queue keys, ARGV=[queue script args, limit]) -> {view, ...}
-- Takes up to `limit` of the oldest claimable messages and deletes them in the same step.
local prefix, name, now, K = queue_script()
local limit = tonumber(ARGV[7])
housekeep(prefix, K, name, now, policy(K))
local out = {}
while #out < limit do
  local ids = redis.call('ZRANGE', K.ready, 0, limit - #out - 1)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    local v = view(message_key(prefix, id), name, id, now)
    if v then table.insert(out, v) end
    remove_message(prefix, K, id)
  end
end
return out
