#!/usr/bin/env bash
# `make libvirt-host`: configure and start libvirtd and virtlogd on this machine without
# systemd (containers and CI runners have none), idempotently.
#
# - Running and healthy (qemu:///system and the in-daemon test driver both answer) and the
#   configuration already as we want it: print so and change nothing.
# - Otherwise: create what libvirt-daemon-system would have created (the libvirt-qemu
#   user/group, runtime and log directories), set the few keys we need in
#   /etc/libvirt/qemu.conf and /etc/libvirt/libvirtd.conf (only those keys are touched, every
#   other line of the files is kept), start virtlogd and libvirtd as daemons, and wait with a
#   deadline until `virsh -c qemu:///system version` works.
# - libvirtd that will not start: one error line and the tail of its log file.
#
# The quirks behind each step are in /work/shared/reference/testbed-facts.md (no security
# driver, no D-Bus, iptables probed at start, the test driver shared through the daemon).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"

URI="qemu:///system"
TEST_URI="test+unix:///default"
CONF_DIR=/etc/libvirt
LOG_DIR=/var/log/libvirt
LIBVIRTD_LOG="$LOG_DIR/libvirtd.log"
VIRTLOGD_LOG="$LOG_DIR/virtlogd.log"
LIBVIRTD_PIDFILE=/run/libvirtd.pid
VIRTLOGD_PIDFILE=/run/virtlogd.pid
START_DEADLINE="${CAPL_LIBVIRTD_START_TIMEOUT:-60}"

need_cmd virsh "install libvirt-clients (make deps)"
need_cmd libvirtd "install libvirt-daemon and libvirt-daemon-driver-qemu (make deps)"
need_cmd virtlogd "install libvirt-daemon (make deps)"
need_cmd qemu-system-x86_64 "install qemu-system-x86 (make deps)"
need_cmd dnsmasq "install dnsmasq-base (make deps): libvirt networks need it for DHCP"
[ -x /usr/sbin/iptables ] ||
	die "/usr/sbin/iptables not found: install iptables (make deps) before libvirtd starts, or network creation fails"
ls /usr/lib/*/libvirt/connection-driver/libvirt_driver_qemu.so >/dev/null 2>&1 ||
	die "libvirt's QEMU driver module is missing: install libvirt-daemon-driver-qemu (make deps)"

# --- helpers ----------------------------------------------------------------------------

# pid_alive PIDFILE NAME: the pid file names a live process whose command is NAME.
pid_alive() {
	local pid
	[ -r "$1" ] || return 1
	pid="$(cat "$1" 2>/dev/null)" || return 1
	[ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
	[ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}

healthy() {
	timeout 15 virsh -q -c "$URI" version >/dev/null 2>&1 &&
		timeout 15 virsh -q -c "$TEST_URI" version >/dev/null 2>&1
}

CHANGED=0

# set_key FILE KEY VALUE: make FILE contain exactly one active `KEY = VALUE` line. An active
# line with another value is rewritten in place, a commented-out default is left alone and the
# setting is appended; the file is only written when its content changes.
set_key() {
	local file="$1" key="$2" value="$3" want tmp
	want="$key = $value"
	if [ -f "$file" ] && grep -qxF "$want" "$file" &&
		[ "$(grep -cE "^[[:space:]]*$key[[:space:]]*=" "$file")" -eq 1 ]; then
		return 0
	fi
	tmp="$(mktemp)"
	if [ -f "$file" ]; then
		# drop every active line for KEY (there may be stale or duplicate ones), keep the rest
		grep -vE "^[[:space:]]*$key[[:space:]]*=" "$file" >"$tmp" || true
	else
		echo "# Written by capl hack/libvirt-host.sh; only the keys it sets are managed." >"$tmp"
	fi
	echo "$want" >>"$tmp"
	$SUDO install -m 0644 "$tmp" "$file"
	rm -f "$tmp"
	note "set $key = $value in $file"
	CHANGED=1
}

configure() {
	# The QEMU driver refuses to load without the libvirt-qemu user (normally created by
	# libvirt-daemon-system, which drags in systemd units we cannot use).
	if ! getent group libvirt-qemu >/dev/null; then
		$SUDO groupadd --system libvirt-qemu
		note "created group libvirt-qemu"
		CHANGED=1
	fi
	if ! getent passwd libvirt-qemu >/dev/null; then
		$SUDO useradd --system --gid libvirt-qemu --home-dir /var/lib/libvirt \
			--no-create-home --shell /usr/sbin/nologin libvirt-qemu
		note "created user libvirt-qemu"
		CHANGED=1
	fi
	$SUDO mkdir -p "$CONF_DIR" "$LOG_DIR" "$LOG_DIR/qemu" /run/libvirt /var/lib/libvirt/qemu \
		/var/lib/libvirt/images /var/lib/libvirt/dnsmasq /var/cache/libvirt
	# No AppArmor/SELinux driver here: QEMU runs as root and libvirt must not chown images.
	set_key "$CONF_DIR/qemu.conf" user '"root"'
	set_key "$CONF_DIR/qemu.conf" group '"root"'
	set_key "$CONF_DIR/qemu.conf" dynamic_ownership 0
	set_key "$CONF_DIR/qemu.conf" security_driver '"none"'
	# swtpm (spec.tpm) as root like QEMU: libvirt's default user `tss` is taken when it exists
	# at the daemon's start, so a daemon started before swtpm-tools was installed ran it as root
	# and one restarted later as tss, which then could not use the root-owned local CA files
	set_key "$CONF_DIR/qemu.conf" swtpm_user '"root"'
	set_key "$CONF_DIR/qemu.conf" swtpm_group '"root"'
	# Warnings and errors to a file we can show when the daemon will not start.
	set_key "$CONF_DIR/libvirtd.conf" log_outputs "\"3:file:$LIBVIRTD_LOG\""
	set_key "$CONF_DIR/virtlogd.conf" log_outputs "\"3:file:$VIRTLOGD_LOG\""
}

# show_log_and_die MESSAGE LOGFILE [EXTRA_FILE]
show_log_and_die() {
	echo "error: $1" >&2
	local f
	for f in "${@:2}"; do
		if [ -s "$f" ]; then
			echo "--- last lines of $f ---" >&2
			$SUDO tail -n 25 "$f" >&2 || true
		fi
	done
	exit 1
}

# what `NAME -d` printed while starting (written by this user, so not under /var/log)
start_out() {
	echo "${TMPDIR:-/tmp}/capl-$1.start.out"
}

start_daemon() { # NAME PIDFILE LOG
	local name="$1" pidfile="$2" log="$3" out
	out="$(start_out "$name")"
	note "starting $name"
	# -d daemonizes after its set-up; a config or socket error makes it exit non-zero here.
	if ! $SUDO "$name" -d -p "$pidfile" >"$out" 2>&1; then
		show_log_and_die "$name -d failed to start" "$out" "$log"
	fi
}

stop_daemon() { # NAME PIDFILE
	local name="$1" pidfile="$2" pid i
	pid_alive "$pidfile" "$name" || return 0
	pid="$(cat "$pidfile")"
	note "stopping $name (pid $pid) to apply the new configuration"
	$SUDO kill -TERM "$pid"
	for ((i = 0; i < 100; i++)); do
		[ -d "/proc/$pid" ] || return 0
		sleep 0.1
	done
	die "$name (pid $pid) did not stop within 10 s after SIGTERM"
}

# --- main -------------------------------------------------------------------------------

if [ "$SUDO" != "__none__" ]; then
	configure
fi

virtlogd_up() {
	pid_alive "$VIRTLOGD_PIDFILE" virtlogd || pgrep -x virtlogd >/dev/null
}
if [ "$CHANGED" = 0 ] && virtlogd_up && healthy; then
	note "libvirtd and virtlogd already running and healthy ($URI, $TEST_URI): nothing to do"
	exit 0
fi

need_root "starting libvirtd"

if [ "$CHANGED" = 1 ]; then
	stop_daemon libvirtd "$LIBVIRTD_PIDFILE"
	stop_daemon virtlogd "$VIRTLOGD_PIDFILE"
fi

pid_alive "$VIRTLOGD_PIDFILE" virtlogd || start_daemon virtlogd "$VIRTLOGD_PIDFILE" "$VIRTLOGD_LOG"
if ! pid_alive "$LIBVIRTD_PIDFILE" libvirtd; then
	# a clean log for this start, so its tail shows this attempt only
	$SUDO truncate -s 0 "$LIBVIRTD_LOG" 2>/dev/null || true
	start_daemon libvirtd "$LIBVIRTD_PIDFILE" "$LIBVIRTD_LOG"
fi

deadline=$((SECONDS + START_DEADLINE))
until timeout 15 virsh -q -c "$URI" version >/dev/null 2>&1; do
	if ! pid_alive "$LIBVIRTD_PIDFILE" libvirtd; then
		show_log_and_die "libvirtd exited during start-up" "$(start_out libvirtd)" "$LIBVIRTD_LOG"
	fi
	if [ "$SECONDS" -ge "$deadline" ]; then
		err="$(timeout 15 virsh -q -c "$URI" version 2>&1 >/dev/null | head -n 3 || true)"
		show_log_and_die "libvirtd is running but $URI does not answer after ${START_DEADLINE}s: $err" \
			"$LIBVIRTD_LOG"
	fi
	sleep 0.2
done
if ! timeout 15 virsh -q -c "$TEST_URI" version >/dev/null 2>&1; then
	err="$(timeout 15 virsh -q -c "$TEST_URI" version 2>&1 >/dev/null | head -n 3 || true)"
	show_log_and_die "libvirtd answers on $URI but not on $TEST_URI (the shared test driver): $err" \
		"$LIBVIRTD_LOG"
fi
note "libvirtd is up: $(virsh -q -c "$URI" version 2>/dev/null | grep -i 'running hypervisor' || echo "$URI")"
