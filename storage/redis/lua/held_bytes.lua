-- held_bytes(KEYS=[the project's message expiry, message sizes (keys.py ProjectKeys.message_expiry,
--            .message_sizes)], ARGV=[now])
--   -> the bytes of the project's live messages' bodies, its use of the `message_bytes` quota (lib.lua
--   held_bytes: the expired ones are forgotten first, as a post would).
return held_bytes({bytes = KEYS[1], sizes = KEYS[2]}, tonumber(ARGV[1]))
