-- create_queue(KEYS=queue keys, ARGV=[prefix, name, now, meta_json, dttl, ddelay, maxpost, maxcc, dlq, dlqttl])
--   -> 1 created (metadata written) | 0 existed (metadata left as it is, as Zaqar does)
local K = keys_from(KEYS, ARGV[2])
if ensure_queue(K, ARGV[2], tonumber(ARGV[3])) == 0 then return 0 end
write_metadata(K, ARGV, 4)
return 1
