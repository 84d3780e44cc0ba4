#!/bin/bash
# Keystone for Charon (docker-compose.yml's `keystone` profile). Every start, idempotently:
#   1. writes keystone.conf (SQLite database and Fernet/credential key repositories under $KEYSTONE_DATA_DIR),
#   2. keystone-manage db_sync, fernet_setup, credential_setup (they leave existing keys alone), bootstrap
#      (the admin user, project and roles, the identity endpoints; the admin's password is reset to
#      $KEYSTONE_ADMIN_PASSWORD),
#   3. serves Keystone on 127.0.0.1:$KEYSTONE_SETUP_PORT only and runs register.py against it: project
#      `service`, the service user Charon validates tokens as (roles service and admin on it), the
#      `messaging` service with its endpoints, and an optional demo user,
#   4. stops that server and execs gunicorn on 0.0.0.0:$KEYSTONE_PORT, so the port answers only once all of
#      the above is done (the compose healthcheck is GET /v3 on it).
# Outside a container (a check by hand): KEYSTONE_DATA_DIR and KEYSTONE_CONF point somewhere writable, and
# keystone-manage, gunicorn and python3 of a virtualenv with keystone come first on PATH.
set -euo pipefail

: "${KEYSTONE_ADMIN_PASSWORD:?set KEYSTONE_ADMIN_PASSWORD (the bootstrap admin's password)}"
: "${CHARON_SERVICE_PASSWORD:?set CHARON_SERVICE_PASSWORD (the password of Charon's service user)}"
DATA="${KEYSTONE_DATA_DIR:-/var/lib/keystone}"
CONF="${KEYSTONE_CONF:-/etc/keystone/keystone.conf}"
PORT="${KEYSTONE_PORT:-5000}"
SETUP_PORT="${KEYSTONE_SETUP_PORT:-5001}"
WORKERS="${KEYSTONE_WORKERS:-2}"
PUBLIC_URL="${KEYSTONE_PUBLIC_URL:-http://localhost:$PORT/v3}"
INTERNAL_URL="${KEYSTONE_INTERNAL_URL:-$PUBLIC_URL}"
REGION="${KEYSTONE_REGION:-RegionOne}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"  # keystone_wsgi.py and register.py

umask 077
mkdir -p "$DATA/fernet-keys" "$DATA/credential-keys" "$(dirname "$CONF")"
# [fernet_receipts] is named too: fernet_setup sets up its repository as well, by default
# /etc/keystone/fernet-keys/ (tests/keystone.py); here both use the tokens' one, Keystone's default layout.
cat >"$CONF" <<EOF
[DEFAULT]
use_stderr = true
debug = ${KEYSTONE_DEBUG:-false}

[database]
connection = sqlite:///$DATA/keystone.db

[token]
provider = fernet

[fernet_tokens]
key_repository = $DATA/fernet-keys

[fernet_receipts]
key_repository = $DATA/fernet-keys

[credential]
key_repository = $DATA/credential-keys

[cache]
enabled = false
EOF
export OS_KEYSTONE_CONFIG_FILES="$CONF"  # read by the WSGI application

manage() { keystone-manage --config-file "$CONF" "$@"; }
owner=(--keystone-user "$(id -un)" --keystone-group "$(id -gn)")
manage db_sync
manage fernet_setup "${owner[@]}"      # no-op when the repository has a key 0
manage credential_setup "${owner[@]}"  # likewise
# the password through the environment, not argv (keystone-manage reads OS_BOOTSTRAP_PASSWORD)
OS_BOOTSTRAP_PASSWORD="$KEYSTONE_ADMIN_PASSWORD" manage bootstrap \
    --bootstrap-username admin \
    --bootstrap-project-name admin \
    --bootstrap-role-name admin \
    --bootstrap-public-url "$PUBLIC_URL" \
    --bootstrap-internal-url "$INTERNAL_URL" \
    --bootstrap-admin-url "$INTERNAL_URL" \
    --bootstrap-region-id "$REGION"

gunicorn_args=(--pythonpath "$HERE" --no-control-socket --graceful-timeout 5)

gunicorn --bind "127.0.0.1:$SETUP_PORT" --workers 1 "${gunicorn_args[@]}" keystone_wsgi:application &
setup_pid=$!
stop_setup() { kill -TERM "$setup_pid" 2>/dev/null && wait "$setup_pid" || true; }
trap stop_setup EXIT
KEYSTONE_SETUP_URL="http://127.0.0.1:$SETUP_PORT/v3" KEYSTONE_REGION="$REGION" python3 "$HERE/register.py"
stop_setup
trap - EXIT

exec gunicorn --bind "0.0.0.0:$PORT" --workers "$WORKERS" --threads 4 "${gunicorn_args[@]}" \
    keystone_wsgi:application
