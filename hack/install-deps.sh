#!/usr/bin/env bash
# Installs the Debian packages the test bed needs. Idempotent: packages already present are
# skipped, and apt is not touched at all when everything is installed.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"

PACKAGES=(
	# libvirt host (testbed-facts: the minimal set that works without systemd)
	qemu-system-x86 qemu-utils libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients
	dnsmasq-base iptables ovmf
	# an emulated TPM 2.0 for machines with spec.tpm (libvirt runs swtpm, swtpm_setup)
	swtpm swtpm-tools
	# building libvirt-python in the virtualenv
	libvirt-dev pkg-config gcc python3-dev
	# guest image: kernel and busybox are extracted from their .debs, the disk is a FAT
	# image made bootable by syslinux without loop devices
	busybox-static dosfstools syslinux syslinux-common mtools cpio zstd
	# remote transports (qemu+ssh tests) and interactive console tests
	openssh-server openssh-client tmux iproute2 netcat-openbsd
	curl ca-certificates
	# real nodes: legacy Ignition needs cgo + libblkid; the node image is a Debian root made
	# by mmdebstrap, its container images are packed by umoci/skopeo, pause is catatonit
	libblkid-dev mmdebstrap umoci skopeo catatonit e2fsprogs fdisk
)

missing=()
for p in "${PACKAGES[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing+=("$p")
	fi
done

if [ "${#missing[@]}" -eq 0 ]; then
	note "system packages: all present"
	exit 0
fi

need_root "installing ${missing[*]}"
need_cmd apt-get "this script supports Debian/Ubuntu hosts"
note "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/capl-apt.log 2>&1; then
	$SUDO apt-get update -q >>/tmp/capl-apt.log 2>&1 || true
	$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/capl-apt.log 2>&1 ||
		{ tail -n 20 /tmp/capl-apt.log >&2; die "apt-get install failed (full log: /tmp/capl-apt.log)"; }
fi
note "system packages installed"
