-- create_queue(KEYS=queue keys, ARGV=[prefix, name, now, meta_json, dttl, ddelay, maxpost, maxcc, dlq,
--                                    dlqttl, expected_version])
--   -> 1 created (metadata written) | 0 existed (metadata left as it is, as Zaqar does). Error CHARON_STALE
--   (nothing created) when the project's metadata version is no longer expected_version.
local K = keys_from(KEYS, ARGV[2])
if redis.call('EXISTS', K.queue) == 1 then return 0 end
if not write_metadata(ARGV[1], K, ARGV, 4) then return redis.error_reply(STALE) end
ensure_queue(K, ARGV[2], tonumber(ARGV[3]))
return 1
