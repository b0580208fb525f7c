#!/usr/bin/env bash
# Install what metaq-py needs on a Debian machine (idempotent).
#   bash scripts/setup.sh          the package and its runtime needs (ZooKeeper from Debian)
#   bash scripts/setup.sh --test   also the test and Spark extras
#   bash scripts/setup.sh --bench  also what bench/vs_redis.py compares against (Debian's redis-server, redis-py)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--bench" ] && ! command -v redis-server >/dev/null; then
    echo "setup: installing Debian's redis-server package (for bench/vs_redis.py)" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq redis-server >/dev/null
fi

if [ ! -f /usr/share/java/zookeeper.jar ]; then
    echo "setup: installing Debian's zookeeper package (for the embedded ZooKeeper)" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq zookeeper >/dev/null
fi

extras=""
if [ "${1:-}" = "--test" ]; then extras="[test,spark]"; fi
if [ "${1:-}" = "--bench" ]; then extras="[bench]"; fi
log=$(mktemp)
if ! python3 -m pip install -q --disable-pip-version-check -e ".${extras}" >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: pip install failed" >&2
    exit 1
fi
rm -f "$log"
command -v metaq >/dev/null || { echo "setup: the metaq command is not on PATH" >&2; exit 1; }
