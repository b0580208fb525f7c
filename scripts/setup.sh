#!/usr/bin/env bash
# Install what metaq-py needs on a Debian machine (idempotent).
#   bash scripts/setup.sh          the package and its runtime needs (ZooKeeper from Debian)
#   bash scripts/setup.sh --test   also the test and Spark extras (Playwright among them), MariaDB (the SQL offset store
#                                  tests) and chromium (the web console's browser tests)
#   bash scripts/setup.sh --bench  also what bench/vs_redis.py compares against (Debian's redis-server, redis-py)
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"

# apt_install PACKAGE WHY: install a Debian package non-interactively (root or sudo).
apt_updated=""
apt_install() {
    echo "setup: installing Debian's $1 package ($2)" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "$apt_updated" ]; then $SUDO apt-get update -qq; apt_updated=1; fi
    $SUDO apt-get install -y -qq "$1" >/dev/null
}

if [ ! -f /usr/share/java/zookeeper.jar ]; then
    apt_install zookeeper "for the embedded ZooKeeper"
fi
# The SQL offset store's integration tests start their own MariaDB server (never the system's).
if [ "$mode" = "--test" ] && ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then
    apt_install mariadb-server "for the SQL offset store tests"
fi
# The chaos suite's hosts mode (--hosts netns, root only) cuts hosts apart with nftables.
if [ "$mode" = "--test" ] && [ "$(id -u)" = 0 ] && ! command -v nft >/dev/null; then
    apt_install nftables "for the chaos hosts mode's partition faults"
fi
# The web console's browser tests (tests/browser) drive Debian's chromium through Playwright
# (installed with the test extras below); Playwright never downloads a browser of its own.
if [ "$mode" = "--test" ] && [ ! -x /usr/bin/chromium ]; then
    apt_install chromium "for the web console's browser tests"
fi
if [ "$mode" = "--bench" ] && ! command -v redis-server >/dev/null; then
    apt_install redis-server "for bench/vs_redis.py"
fi

# The compiled hot paths (metaq/_speedups.c: the client's decode of fetched records, the
# broker's record walks, frames and request parsing; built by setup.py during the pip install below) needs a C compiler
# and the headers of Python and zlib; without them the install still succeeds and metaq runs
# the same code in pure Python (slower).
if ! command -v cc >/dev/null; then
    apt_install gcc "to build the compiled hot paths"
fi
if [ ! -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then
    apt_install python3-dev "to build the compiled hot paths"
fi
if [ ! -f /usr/include/zlib.h ]; then
    apt_install zlib1g-dev "to build the compiled hot paths"
fi

extras=""
if [ "$mode" = "--test" ]; then extras="[test,spark]"; fi
if [ "$mode" = "--bench" ]; then extras="[bench]"; fi
log=$(mktemp)
if ! python3 -m pip install -q --disable-pip-version-check -e ".${extras}" >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: pip install failed" >&2
    exit 1
fi
rm -f "$log"
command -v metaq >/dev/null || { echo "setup: the metaq command is not on PATH" >&2; exit 1; }
python3 -c "import metaq._speedups" 2>/dev/null \
    || echo "setup: warning: metaq._speedups was not built; metaq runs its pure-Python code" >&2
