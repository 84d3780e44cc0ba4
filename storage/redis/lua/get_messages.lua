-- get_messages(KEYS=queue keys, message1, message2, ...; ARGV=[queue script args, id1, id2, ...])
--   -> {view, ...}
-- The live messages of the queue among the ids, in the order asked; unknown ids are left out.
local _, name, now = queue_script()
local out = {}
for i = 7, #ARGV do
  local v = view(KEYS[i + 2], name, ARGV[i], now)
  if v then table.insert(out, v) end
end
return out
