-- stats(KEYS=queue keys, ARGV=[prefix, name, now])
--   -> {total, claimed, delayed, n_dl, n_disc, n_rcv, n_dl_mc, n_dl_exp, n_dl_rej, n_rd, oldest_id, oldest_cr,
--       newest_id, newest_cr}
local prefix, name, now, K = queue_script()
housekeep(prefix, K, name, now, policy(K))
local out = {redis.call('ZCARD', K.msgs), redis.call('ZCARD', K.claimed), redis.call('ZCARD', K.delayed)}
for _, n in ipairs(redis.call('HMGET', K.queue, 'n_dl', 'n_disc', 'n_rcv', 'n_dl_mc', 'n_dl_exp', 'n_dl_rej',
                              'n_rd')) do
  table.insert(out, tonumber(n) or 0)
end
for _, range in ipairs({{0, 0}, {-1, -1}}) do
  local ids = redis.call('ZRANGE', K.msgs, range[1], range[2])
  if #ids == 1 then
    table.insert(out, ids[1])
    table.insert(out, redis.call('HGET', message_key(prefix, ids[1]), 'cr') or 0)
  else
    table.insert(out, '')
    table.insert(out, 0)
  end
end
return out
