-- unsubscribe(KEYS=queue keys; ARGV=[queue script args, id or '' for every subscription of the queue]) -> 1
-- Deletes the subscription(s); what they are still owed is dropped when a notifier leases it.
local prefix, name, now, K = queue_script()
local sid = ARGV[7]
if sid == '' then
  drop_subscriptions(prefix, K, now, true)
elseif redis.call('HGET', subscription_key(prefix, sid), 'q') == name then
  remove_subscription(prefix, K, sid)
end
return 1
