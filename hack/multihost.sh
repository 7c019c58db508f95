#!/usr/bin/env bash
# `make multihost-bed`: three real libvirt hosts on this machine, each libvirtd + virtlogd in
# a network and mount namespace of its own, joined by the LAN bridge capllan0
# (capl/testbed/multihost.py says how it is built). The machine's own libvirtd is not touched.
#
#   hack/multihost.sh [start]   start it (a healthy bed: says so and changes nothing)
#   hack/multihost.sh status    healthy (exit 0), unhealthy (1) or not running (3)
#   hack/multihost.sh stop      remove everything it made: daemons (by PID), namespaces, veths,
#                               bridge, the LAN's dnsmasq, its state directory; refused while a
#                               test session uses the bed (stop --force: stop it anyway)
#
# A bed started here stays until stopped here; one a test session started is stopped by the
# last test session that uses it (capl/testbed/multihost_lock.py).
#
# State: /var/lib/capl-multihost (CAPL_MULTIHOST_DIR); capl's credentials for the hosts are
# in its client/ directory.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
cd "$HERE/.."

[ "$(id -u)" -eq 0 ] || die "the multi-host bed needs root (network and mount namespaces)"
[ -x .venv/bin/python ] || die ".venv is missing: run \`make venv\`"
exec .venv/bin/python -m capl.testbed.multihost "${1:-start}" "${@:2}"
