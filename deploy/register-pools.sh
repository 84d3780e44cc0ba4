#!/bin/sh
# Registers the pools of docker-compose.yml's `pools` profile and a flavor through the admin API of one replica
# (idempotent: an existing pool answers 409 and is left as it is). The MongoDB pool is database charon_pool of
# the replica set the `mongodb` profile's Charon uses (database charon): each store has one Charon.
set -eu
API="${API:-http://pool-api-1:8888}"
until curl -fsS "$API/readyz" >/dev/null; do sleep 1; done  # 204 once the catalogue takes writes
put() { curl -sS -o /dev/null -w "PUT $1: %{http_code}\n" -X PUT "$API$1" -H 'X-Roles: admin' -H 'Content-Type: application/json' -d "$2"; }
put /v2/pools/redis-a '{"uri": "redis://pool-redis-a:6379/0", "weight": 100}'
put /v2/pools/redis-b '{"uri": "redis://pool-redis-b:6379/0", "weight": 100}'
put /v2/flavors/durable '{"capabilities": {"durability": true}}'
put /v2/pools/mongo '{"uri": "mongodb://mongodb:27017/charon_pool?replicaSet=rs0", "weight": 0, "flavor": "durable"}'
