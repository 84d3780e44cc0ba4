-- delete_messages(KEYS=queue keys, ARGV=[prefix, name, now, id1, id2, ...]) -> number deleted.
-- Bulk delete by ids ignores claims, as Zaqar's does.
local prefix, name = ARGV[1], ARGV[2]
local K = keys_from(KEYS, ARGV[2])
local n = 0
for i = 4, #ARGV do
  if redis.call('HGET', prefix .. 'm:' .. ARGV[i], 'q') == name then
    remove_message(prefix, K, ARGV[i])
    n = n + 1
  end
end
return n
