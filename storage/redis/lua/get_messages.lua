-- get_messages(KEYS=queue keys, ARGV=[prefix, name, now, id1, id2, ...]) -> {view, ...}
-- The live messages of the queue among the ids, in the order asked; unknown ids are left out.
local prefix, name, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV do
  local v = view(prefix, name, ARGV[i], now)
  if v then table.insert(out, v) end
end
return out
