-- delete_messages(KEYS=queue keys, message1, message2, ...; ARGV=[queue script args, id1, id2, ...])
--   -> number deleted.
-- Bulk delete by ids ignores claims, as Zaqar's does.
local prefix, name, now, K = queue_script()
local n = 0
for i = 7, #ARGV do
  if redis.call('HGET', KEYS[i + 2], 'q') == name then
    remove_message(prefix, K, ARGV[i])
    n = n + 1
  end
end
return n
