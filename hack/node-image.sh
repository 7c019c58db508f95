#!/usr/bin/env bash
# `make node-image`: build the capl node image, a CoreOS-like qcow2 that becomes a real
# Kubernetes node, and print its path as the last line of output.
#
# What is in it: a Debian 12 root (mmdebstrap from Debian's packages: systemd, the cloud
# kernel, runc, CNI plugins, iptables/conntrack, qemu-guest-agent, cloud-init) plus what
# hack/node-bin.sh builds (kubelet, kubeadm, containerd 2.x, legacy Ignition) and
# hack/node/rootfs (units, kubeadm's kubelet drop-in, containerd and CNI config, the
# initramfs hook that runs Ignition). Container images kubelet and kubeadm need offline are
# built here from local binaries (pause from Debian's catatonit, a busybox test image, and
# for a kubeadm control plane kube-apiserver, kube-controller-manager, kube-scheduler and
# etcd from the envtest and node-bin builds) and preloaded into the root's containerd store
# at build time: no registry is involved and the guest imports nothing at boot.
#
# Boot: MBR disk, partition 1 FAT with syslinux, the kernel and a small initramfs; partition
# 2 the ext4 root (label capl-root), made with `mkfs.ext4 -d`: no loop device is needed.
# On the first boot Ignition runs in the initramfs (see hack/node/rootfs/etc/initramfs-tools)
# reading QEMU fw_cfg opt/com.coreos/config as Flatcar does; with a NoCloud ISO, cloud-init
# runs the cloud-config instead.
#
# Output: $CAPL_CACHE/node-image/<hash>/capl-node.qcow2; <hash> covers this script,
# hack/node/**, the binaries and the state of apt's lists, so changing any input builds a
# new image and an unchanged one returns at once.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
# shellcheck source=hack/versions.env
. "$HERE/versions.env"

IMAGE_NAME=capl-node.qcow2
OUT_ROOT="$CAPL_CACHE/node-image"
ROOT_SIZE_MIB=6144
BOOT_SIZE_MIB=96
# Debian packages of the root (Depends only, no Recommends)
PACKAGES=(
	systemd systemd-sysv systemd-resolved dbus polkitd udev kmod initramfs-tools zstd busybox linux-image-cloud-amd64
	iproute2 iptables conntrack ebtables ethtool socat ca-certificates mount util-linux procps
	runc containernetworking-plugins qemu-guest-agent cloud-init bash
)

NODE_BIN="${CAPL_NODE_BIN:-$("$HERE/node-bin.sh" | tail -n1)}"
ENVTEST="$("$HERE/envtest.sh" | tail -n1)"
[ -x "$NODE_BIN/bin/kubelet" ] || die "no kubelet in $NODE_BIN/bin (hack/node-bin.sh)"

need_cmd mmdebstrap "install mmdebstrap (make deps)"
need_cmd umoci "install umoci (make deps)"
need_cmd skopeo "install skopeo (make deps)"
need_cmd qemu-img "install qemu-utils (make deps)"
need_cmd sfdisk "install fdisk (make deps)"
need_cmd syslinux "install syslinux (make deps)"
need_cmd mcopy "install mtools (make deps)"
[ -x /usr/bin/catatonit ] || die "catatonit (the pause process) not found: install catatonit (make deps)"
[ -x /bin/busybox ] || die "busybox-static not found (make deps)"
need_root "building the node image (mmdebstrap chroot)"

mkdir -p "$OUT_ROOT"
lists_state() {
	{
		ls -l --time-style=+%s /var/lib/apt/lists/*Packages* 2>/dev/null
		cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null
	} | sha256sum | cut -c1-16
}
HASH="$(
	{
		lists_state
		echo "${PACKAGES[*]}"
		sha256sum <"$HERE/node-image.sh"
		(cd "$HERE/node" && find . -type f | LC_ALL=C sort | xargs sha256sum)
		(cd "$NODE_BIN/bin" && ls -l --time-style=+%s)
		(cd "$ENVTEST" && ls -l --time-style=+%s kube-apiserver etcd)
	} | sha256sum | cut -c1-16
)"
OUT="$OUT_ROOT/$HASH"
if [ -s "$OUT/$IMAGE_NAME" ]; then
	note "node image cached ($OUT)"
	echo "$OUT/$IMAGE_NAME"
	exit 0
fi
exec 9>"$OUT_ROOT/.lock"
flock 9
if [ -s "$OUT/$IMAGE_NAME" ]; then
	echo "$OUT/$IMAGE_NAME"
	exit 0
fi

t0=$SECONDS
WORK="$(mktemp -d "$OUT_ROOT/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
LOG="$OUT_ROOT/build-$HASH.log"
: >"$LOG"
ROOT="$WORK/root"

# --- container images, from local binaries ----------------------------------------------

# oci_image NAME:TAG ENTRYPOINT FILE=PATH...: a single-layer image holding FILEs, saved as a
# docker-archive under $WORK/images (preload_images puts it into the root).
oci_image() {
	local ref="$1" entry="$2" layout="$WORK/oci" bundle="$WORK/bundle" spec dest src
	shift 2
	rm -rf "$layout" "$bundle"
	umoci init --layout "$layout"
	umoci new --image "$layout:img"
	umoci unpack --image "$layout:img" "$bundle" >/dev/null
	for spec in "$@"; do
		dest="${spec%%=*}" src="${spec#*=}"
		mkdir -p "$bundle/rootfs/$(dirname "$dest")"
		cp "$src" "$bundle/rootfs/$dest"
	done
	umoci repack --image "$layout:img" "$bundle"
	# shellcheck disable=SC2086 # the entrypoint is a list of words
	umoci config --image "$layout:img" --config.entrypoint ${entry// / --config.entrypoint } \
		--config.env PATH=/usr/local/bin:/usr/bin:/bin --os linux --architecture amd64
	skopeo copy -q "oci:$layout:img" "docker-archive:$WORK/images/${ref//[\/:]/_}.tar:$ref"
}

build_images() {
	local k="$NODE_BIN/bin" pause="registry.k8s.io/pause:3.10.1"
	mkdir -p "$WORK/images"
	oci_image "$pause" "/pause -P" /pause=/usr/bin/catatonit
	# a test workload: busybox, `echo` and `sleep` without a registry
	oci_image capl.local/busybox:1 "/bin/busybox sh" /bin/busybox=/bin/busybox
	# a kubeadm control plane's static pods (KubeadmControlPlane in a TCG guest)
	oci_image "registry.k8s.io/kube-apiserver:$KUBERNETES_VERSION" /usr/local/bin/kube-apiserver \
		/usr/local/bin/kube-apiserver="$ENVTEST/kube-apiserver"
	oci_image "registry.k8s.io/kube-controller-manager:$KUBERNETES_VERSION" /usr/local/bin/kube-controller-manager \
		/usr/local/bin/kube-controller-manager="$k/kube-controller-manager"
	oci_image "registry.k8s.io/kube-scheduler:$KUBERNETES_VERSION" /usr/local/bin/kube-scheduler \
		/usr/local/bin/kube-scheduler="$k/kube-scheduler"
	oci_image "registry.k8s.io/etcd:${ETCD_VERSION#v}-0" /usr/local/bin/etcd \
		/usr/local/bin/etcd="$ENVTEST/etcd"
}

# preload_images: import the archives into the root's own containerd store (content and
# unpacked overlayfs snapshots in /var/lib/containerd, namespace k8s.io where the CRI plugin
# looks) with the node's containerd running on the build host for the purpose: the guest
# pays nothing at boot (importing them under TCG takes minutes).
preload_images() {
	local sock="$WORK/containerd.sock" pid archive
	{
		echo 'version = 3'
		echo "root = \"$ROOT/var/lib/containerd\""
		echo "state = \"$WORK/containerd-state\""
		echo 'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]'
		echo '[grpc]'
		echo "  address = \"$sock\""
	} >"$WORK/containerd-build.toml"
	"$NODE_BIN/bin/containerd" --config "$WORK/containerd-build.toml" >"$WORK/containerd.log" 2>&1 &
	pid=$!
	# wait (30 s at most) until it answers, or has died
	for _ in $(seq 1 300); do
		[ -S "$sock" ] && "$NODE_BIN/bin/ctr" --address "$sock" version >/dev/null 2>&1 && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	"$NODE_BIN/bin/ctr" --address "$sock" version >/dev/null 2>&1 || { cat "$WORK/containerd.log"; kill "$pid" 2>/dev/null; return 1; }
	for archive in "$WORK/images/"*.tar; do
		"$NODE_BIN/bin/ctr" --address "$sock" --namespace k8s.io images import --snapshotter overlayfs "$archive" ||
			{ kill "$pid"; return 1; }
	done
	"$NODE_BIN/bin/ctr" --address "$sock" --namespace k8s.io images ls -q
	kill "$pid"
	wait "$pid" || true
}

# --- the root -----------------------------------------------------------------------------

mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)"
mirror="${mirror:-http://deb.debian.org/debian}"
note "building node image $HASH: mmdebstrap (Debian bookworm from $mirror)"
include="$(IFS=,; echo "${PACKAGES[*]}")"
# The kernel's postinst builds the initramfs: the hook and the module list must be in place
# (with the Ignition binary) before the packages are installed.
mmdebstrap --variant=minbase --include="$include" --aptopt='APT::Install-Recommends "false"' \
	--setup-hook="mkdir -p \"\$1/usr/lib/capl\" && cp -a '$HERE/node/rootfs/.' \"\$1/\" && cp '$NODE_BIN/bin/ignition' \"\$1/usr/lib/capl/ignition\"" \
	--dpkgopt='force-confold' \
	bookworm "$ROOT" "$mirror" >>"$LOG" 2>&1 ||
	{ tail -n 30 "$LOG" >&2; die "mmdebstrap failed (log: $LOG)"; }

note "node binaries and images"
for b in kubelet kubeadm containerd containerd-shim-runc-v2 ctr; do
	install -m 0755 "$NODE_BIN/bin/$b" "$ROOT/usr/local/bin/$b"
done
build_images >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; die "building the container images failed (log: $LOG)"; }
preload_images >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; die "preloading the container images failed (log: $LOG)"; }

# systemd: units on, the serial getty off (the serial console is the boot log capl reads),
# no static hostname (the DHCP host name capl reserves is the node name), first boot state:
# an uninitialized machine-id makes systemd apply presets once, which is how legacy Ignition
# enables units (it writes a preset file, not symlinks).
chroot "$ROOT" systemctl enable containerd.service capl-cri-ready.service kubelet.service capl-ignition-report.service \
	systemd-networkd.service systemd-networkd-wait-online.service systemd-resolved.service >>"$LOG" 2>&1
chroot "$ROOT" systemctl mask serial-getty@ttyS0.service >>"$LOG" 2>&1
rm -f "$ROOT/etc/hostname"
echo uninitialized >"$ROOT/etc/machine-id"
ln -sf /run/systemd/resolve/stub-resolv.conf "$ROOT/etc/resolv.conf"
echo "LABEL=capl-root / ext4 defaults 0 1" >"$ROOT/etc/fstab"
: >"$ROOT/boot/ignition.firstboot"
rm -rf "$ROOT/var/cache/apt/archives/"*.deb "$ROOT/var/lib/apt/lists/"*

# --- the disk -----------------------------------------------------------------------------

note "disk: FAT boot partition (syslinux) + ext4 root"
kernel="$(cd "$ROOT/boot" && ls vmlinuz-* | head -n1)"
initrd="initrd.img-${kernel#vmlinuz-}"
[ -s "$ROOT/boot/$initrd" ] || die "no initramfs $initrd in the root (log: $LOG)"
cat >"$WORK/syslinux.cfg" <<EOF
DEFAULT node
TIMEOUT 0
PROMPT 0
LABEL node
  KERNEL /vmlinuz
  INITRD /initrd.img
  APPEND root=LABEL=capl-root rw console=ttyS0,115200 panic=10
EOF
boot_off=$((1024 * 1024))
root_off=$((boot_off + BOOT_SIZE_MIB * 1024 * 1024))
disk="$WORK/disk.raw"
truncate -s $((root_off + ROOT_SIZE_MIB * 1024 * 1024)) "$disk"
printf 'label: dos\nstart=%s, size=%s, type=c, bootable\nstart=%s, type=83\n' \
	$((boot_off / 512)) $((BOOT_SIZE_MIB * 2048)) $((root_off / 512)) | sfdisk -q "$disk" >>"$LOG" 2>&1
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$disk" bs=440 count=1 conv=notrunc status=none
truncate -s $((BOOT_SIZE_MIB * 1024 * 1024)) "$WORK/boot.img"
mkfs.vfat -n CAPL-BOOT -h $((boot_off / 512)) "$WORK/boot.img" >>"$LOG"
mcopy -i "$WORK/boot.img" "$ROOT/boot/$kernel" ::/vmlinuz
mcopy -i "$WORK/boot.img" "$ROOT/boot/$initrd" ::/initrd.img
mcopy -i "$WORK/boot.img" "$WORK/syslinux.cfg" ::/syslinux.cfg
dd if="$WORK/boot.img" of="$disk" bs=1M seek=$((boot_off / 1048576)) conv=notrunc,sparse status=none
syslinux --offset "$boot_off" --install "$disk"
truncate -s $((ROOT_SIZE_MIB * 1024 * 1024)) "$WORK/root.img"
mkfs.ext4 -q -L capl-root -d "$ROOT" "$WORK/root.img"
dd if="$WORK/root.img" of="$disk" bs=1M seek=$((root_off / 1048576)) conv=notrunc,sparse status=none
mkdir -p "$OUT.tmp"
qemu-img convert -c -O qcow2 "$disk" "$OUT.tmp/$IMAGE_NAME"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
note "node image built in $((SECONDS - t0)) s: $(du -m "$OUT/$IMAGE_NAME" | cut -f1) MiB ($kernel)"
echo "$OUT/$IMAGE_NAME"
