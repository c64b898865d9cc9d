#!/usr/bin/env bash
# install-peers.sh installs the comparator servers the bench/compare module
# starts by itself (Redis, ZooKeeper with its Java runtime) from Debian's
# packages. etcd needs nothing: it runs embedded from the Go module.
# The Debian packages also install services; the bench never uses them and
# starts its own processes on 127.0.0.1, so stop them if they were started.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends redis-server zookeeper
# Package post-install scripts may have started system-wide daemons on the
# default ports; the bench does not need them.
if command -v service >/dev/null 2>&1; then
  $SUDO service redis-server stop >/dev/null 2>&1 || true
  $SUDO service zookeeper stop >/dev/null 2>&1 || true
fi
