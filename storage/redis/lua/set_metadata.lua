-- set_metadata(KEYS=queue keys, ARGV=[prefix, name, now, meta_json, dttl, ddelay, maxpost, maxcc, dlq, dlqttl])
--   -> 1. Creates the queue when absent; replaces its metadata and policy fields in one step.
local K = keys_from(KEYS, ARGV[2])
ensure_queue(K, ARGV[2], tonumber(ARGV[3]))
write_metadata(K, ARGV, 4)
return 1
