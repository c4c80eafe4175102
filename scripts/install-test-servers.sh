#!/usr/bin/env bash
# Installs the database servers that the state store's tests start by themselves (tests/state_servers.py):
# redis-server and PostgreSQL, from Debian's packages. Idempotent: a second run only checks and exits.
# Needs root or sudo to install; without apt-get it says what to install and exits 0 (those tests
# then skip, saying why).
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    need+=(postgresql)
fi
if [ ${#need[@]} -eq 0 ]; then
    echo "test servers: redis-server and PostgreSQL are installed"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "test servers: no apt-get here; install ${need[*]} to run the Redis and PostgreSQL tests" >&2
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
# The packages' own services are not used: the tests run their own servers on ephemeral ports.
$sudo apt-get install -y -q --no-install-recommends "${need[@]}"
echo "test servers: installed ${need[*]}"
