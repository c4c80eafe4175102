#!/usr/bin/env bash
# Installs the servers that tests start by themselves:
# - redis-server and PostgreSQL for the state store's tests (tests/state_servers.py), from Debian's
#   packages. Needs root or sudo to install; without apt-get it says what to install and exits 0
#   (those tests then skip, saying why).
# - smg, pinned, from PyPI into a venv of its own (~/.cache/trio-direct-smg-venv, where the tests'
#   `smg_executable` fixture and the benchmarks look): the peer gateway of the interop tests and
#   benchmarks, and the tonic (Rust) gRPC servers of the transport's conformance tests. Its own
#   venv keeps its dependencies out of the project's. A failed install makes this script exit 1.
# Idempotent: a second run only checks and exits.
set -euo pipefail

SMG_VERSION=1.13.0
smg_venv="$HOME/.cache/trio-direct-smg-venv"
status=0
if [ -x "$smg_venv/bin/smg" ] && "$smg_venv/bin/python" -c \
    "import importlib.metadata as m, sys; sys.exit(m.version('smg') != '$SMG_VERSION')" 2>/dev/null; then
    echo "test servers: smg $SMG_VERSION is installed"
elif python3 -m venv "$smg_venv" && "$smg_venv/bin/pip" install -q "smg==$SMG_VERSION"; then
    echo "test servers: installed smg $SMG_VERSION into $smg_venv"
else
    echo "test servers: could not install smg==$SMG_VERSION into $smg_venv" >&2
    status=1
fi

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    need+=(postgresql)
fi
if [ ${#need[@]} -eq 0 ]; then
    echo "test servers: redis-server and PostgreSQL are installed"
    exit "$status"
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "test servers: no apt-get here; install ${need[*]} to run the Redis and PostgreSQL tests" >&2
    exit "$status"
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
exit "$status"
