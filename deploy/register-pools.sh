#!/bin/sh
# Registers the compose file's pools and a flavor through the admin API of one replica (idempotent:
# an existing pool answers 409 and is left as it is).
set -eu
API="${API:-http://api-1:8888}"
until curl -fsS "$API/v2/ping" >/dev/null; do sleep 1; done
put() { curl -sS -o /dev/null -w "PUT $1: %{http_code}\n" -X PUT "$API$1" -H 'X-Roles: admin' -H 'Content-Type: application/json' -d "$2"; }
put /v2/pools/redis-a '{"uri": "redis://redis-a:6379/0", "weight": 100}'
put /v2/pools/redis-b '{"uri": "redis://redis-b:6379/0", "weight": 100}'
put /v2/flavors/durable '{"capabilities": {"durability": true}}'
put /v2/pools/mongo '{"uri": "mongodb://mongo:27017/charon?replicaSet=rs0", "weight": 0, "flavor": "durable"}'
