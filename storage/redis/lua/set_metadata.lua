-- set_metadata(KEYS=queue keys, ARGV=[prefix, name, now, meta_json, dttl, ddelay, maxpost, maxcc, dlq,
--                                    dlqttl, expected_version])
--   -> 1. Creates the queue when absent; replaces its metadata and policy fields in one step. Error
--   CHARON_STALE (nothing written) when the project's metadata version is no longer expected_version.
local K = keys_from(KEYS, ARGV[2])
if not write_metadata(ARGV[1], K, ARGV, 4) then return redis.error_reply(STALE) end
ensure_queue(K, ARGV[2], tonumber(ARGV[3]))
return 1
