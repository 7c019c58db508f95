#!/usr/bin/env bash
# `make guest-image`: build the capl test guest, a tiny bootable qcow2 "CoreOS stand-in",
# from Debian packages only, and print its path as the last line of output.
#
# Inputs: linux-image-cloud-amd64 (resolved to its versioned image package) and
# busybox-static, fetched with `apt-get download` and unpacked with `dpkg-deb -x` (nothing is
# installed on the host), plus hack/guest/* (init, inittab, module lists, syslinux.cfg...).
# Output: $CAPL_CACHE/guest/<hash>/capl-guest.qcow2, where <hash> covers this script, every
# file under hack/guest and the package versions, so a change to any input builds a new image
# and an unchanged one returns at once. Resolving package versions with apt-cache is slow
# without apt's binary cache (containers disable it), so the resolution is remembered per
# state of the apt lists.
#
# The disk needs no loop device and no root: a FAT image made by mkfs.vfat, made bootable by
# `syslinux --install`, filled with mtools, converted with `qemu-img convert -O qcow2`. The
# guest itself (busybox init, the marker protocol on ttyS0) is described in hack/guest/init.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"

GUEST_SRC="$HERE/guest"
KERNEL_META=linux-image-cloud-amd64
BUSYBOX_PKG=busybox-static
IMAGE_NAME=capl-guest.qcow2
OUT_ROOT="$CAPL_CACHE/guest"

need_cmd sha256sum "install coreutils"
mkdir -p "$OUT_ROOT/resolved"

# --- inputs and the cache key -------------------------------------------------------------

# The state of apt's package lists: when it changes, package versions are resolved again.
lists_state() {
	{
		ls -l --time-style=+%s /var/lib/apt/lists/*Packages* /var/lib/apt/lists/*Release* 2>/dev/null
		cat /etc/apt/sources.list /etc/apt/sources.list.d/* /etc/apt/preferences.d/* 2>/dev/null
	} | sha256sum | cut -c1-16
}

# Prints "<kernel image package> <its version> <busybox-static version>".
resolve_versions() {
	local memo out img img_ver bb_ver
	memo="$OUT_ROOT/resolved/$(lists_state)"
	if [ -s "$memo" ]; then
		cat "$memo"
		return
	fi
	need_cmd apt-cache "this script needs Debian's apt"
	out="$(apt-cache show --no-all-versions "$KERNEL_META" "$BUSYBOX_PKG" 2>&1)" ||
		die "apt-cache cannot resolve $KERNEL_META/$BUSYBOX_PKG (run 'apt-get update'): $(echo "$out" | tail -n 1)"
	# the metapackage depends on exactly one versioned image package: "linux-image-X (= V)"
	img="$(echo "$out" | awk -v p="$KERNEL_META" '
		/^Package:/ { cur = $2 }
		cur == p && /^Depends:/ { if (match($0, /linux-image-[0-9][^ ,]* \(= [^)]*\)/)) print substr($0, RSTART, RLENGTH) }')"
	[ -n "$img" ] || die "cannot find the versioned kernel image package $KERNEL_META depends on"
	img_ver="$(echo "$img" | sed 's/.*(= \(.*\))/\1/')"
	img="${img%% *}"
	bb_ver="$(echo "$out" | awk -v p="$BUSYBOX_PKG" '/^Package:/ { cur = $2 } cur == p && /^Version:/ { print $2 }')"
	[ -n "$bb_ver" ] || die "apt knows no version of $BUSYBOX_PKG (run 'apt-get update')"
	echo "$img $img_ver $bb_ver" | tee "$memo.tmp"
	mv "$memo.tmp" "$memo"
}

read -r KERNEL_PKG KERNEL_VER BUSYBOX_VER <<<"$(resolve_versions)"
HASH="$(
	{
		echo "$KERNEL_PKG $KERNEL_VER $BUSYBOX_PKG $BUSYBOX_VER"
		sha256sum <"$HERE/guest-image.sh"
		(cd "$GUEST_SRC" && find . -type f | LC_ALL=C sort | xargs sha256sum)
	} | sha256sum | cut -c1-16
)"
OUT="$OUT_ROOT/$HASH"
if [ -s "$OUT/$IMAGE_NAME" ]; then
	note "guest image cached ($KERNEL_PKG $KERNEL_VER, busybox $BUSYBOX_VER)"
	echo "$OUT/$IMAGE_NAME"
	exit 0
fi

# --- build --------------------------------------------------------------------------------

MKFS_VFAT="$(command -v mkfs.vfat || echo /usr/sbin/mkfs.vfat)"
[ -x "$MKFS_VFAT" ] || die "mkfs.vfat not found: install dosfstools (make deps)"
need_cmd apt-get "this script needs Debian's apt"
need_cmd dpkg-deb "this script needs dpkg"
need_cmd syslinux "install syslinux and syslinux-common (make deps)"
need_cmd mcopy "install mtools (make deps)"
need_cmd cpio "install cpio (make deps)"
need_cmd qemu-img "install qemu-utils (make deps)"
need_cmd gzip "install gzip"
need_cmd flock "install util-linux"

# one build at a time (make test and a developer's make guest-image may race)
exec 9>"$OUT_ROOT/.lock"
flock 9
if [ -s "$OUT/$IMAGE_NAME" ]; then
	note "guest image built by a concurrent run"
	echo "$OUT/$IMAGE_NAME"
	exit 0
fi

t0=$SECONDS
note "building guest image $HASH ($KERNEL_PKG $KERNEL_VER, busybox $BUSYBOX_VER)"
DEBS="$OUT_ROOT/debs"
mkdir -p "$DEBS"
WORK="$(mktemp -d "$OUT_ROOT/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# fetch (kept in the cache: a rebuild after a change to hack/guest downloads nothing)
fetch() { # PACKAGE VERSION -> path of the .deb
	local pkg="$1" ver="$2" deb log
	deb="$(find "$DEBS" -maxdepth 1 -name "${pkg}_*.deb" | while read -r f; do
		[ "$(dpkg-deb -f "$f" Version)" = "$ver" ] && echo "$f" && break
	done)"
	if [ -z "$deb" ]; then
		log="$WORK/apt-download.log"
		(cd "$DEBS" && apt-get download -q "$pkg=$ver" >"$log" 2>&1) || {
			grep -v '^W: Download is performed unsandboxed' "$log" | tail -n 5 >&2
			die "apt-get download $pkg=$ver failed (run 'apt-get update'?)"
		}
		deb="$(find "$DEBS" -maxdepth 1 -name "${pkg}_*.deb" -newer "$WORK" | head -n 1)"
		[ -n "$deb" ] || deb="$(ls -t "$DEBS/${pkg}"_*.deb | head -n 1)"
	fi
	echo "$deb"
}
kernel_deb="$(fetch "$KERNEL_PKG" "$KERNEL_VER")"
busybox_deb="$(fetch "$BUSYBOX_PKG" "$BUSYBOX_VER")"

dpkg-deb -x "$kernel_deb" "$WORK/kernel"
dpkg-deb -x "$busybox_deb" "$WORK/busybox"
BB="$WORK/busybox/bin/busybox"
[ -x "$BB" ] || die "$busybox_deb has no bin/busybox"
KVER="$(ls "$WORK/kernel/lib/modules")"
[ "$(echo "$KVER" | wc -l)" -eq 1 ] || die "expected one kernel in $kernel_deb, found: $KVER"
VMLINUZ="$WORK/kernel/boot/vmlinuz-$KVER"
[ -f "$VMLINUZ" ] || die "$kernel_deb has no boot/vmlinuz-$KVER"
# the package leaves modules.dep to its postinst; busybox's depmod writes it for the tree
"$BB" depmod -b "$WORK/kernel" "$KVER"

# --- initramfs ----------------------------------------------------------------------------
ROOT="$WORK/root"
mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,etc/capl,etc/acpi/PWRF,dev,proc,sys,run,tmp,root,mnt,var/log}
install -m 0755 "$BB" "$ROOT/bin/busybox"
# applet links, e.g. /bin/sh, /sbin/init, /usr/bin/awk
"$BB" --list-full | while read -r applet; do
	[ -e "$ROOT/$applet" ] || ln -s /bin/busybox "$ROOT/$applet"
done
install -m 0755 "$GUEST_SRC/init" "$ROOT/init"
install -m 0755 "$GUEST_SRC/udhcpc.script" "$ROOT/etc/capl/udhcpc.script"
install -m 0755 "$GUEST_SRC/agent" "$ROOT/etc/capl/agent"
install -m 0755 "$GUEST_SRC/acpi-power" "$ROOT/etc/acpi/PWRF/00000080"
install -m 0644 "$GUEST_SRC/jsonflat.awk" "$ROOT/etc/capl/jsonflat.awk"
install -m 0644 "$GUEST_SRC/inittab" "$ROOT/etc/inittab"
install -m 0644 "$GUEST_SRC/profile" "$ROOT/etc/profile"
echo "root:x:0:0:root:/root:/bin/sh" >"$ROOT/etc/passwd"
echo "root:x:0:" >"$ROOT/etc/group"
echo localhost >"$ROOT/etc/hostname"

# module lists: each wanted module after its own dependencies (depth-first over modules.dep),
# written as paths relative to /lib/modules for /init's insmod loop
MODDEP="$WORK/kernel/lib/modules/$KVER/modules.dep"
declare -A placed=()
place() { # MODULE-PATH (relative to lib/modules/KVER)
	local rel="$1" dep
	[ -n "${placed[$rel]:-}" ] && return
	for dep in $(awk -v m="$rel:" '$1 == m { $1 = ""; print }' "$MODDEP"); do
		place "$dep"
	done
	placed[$rel]=1
	mkdir -p "$ROOT/lib/modules/$KVER/$(dirname "$rel")"
	cp "$WORK/kernel/lib/modules/$KVER/$rel" "$ROOT/lib/modules/$KVER/$rel"
	echo "$KVER/$rel" >>"$CURRENT_LIST"
}
for list in boot cidata; do
	CURRENT_LIST="$ROOT/etc/capl/modules.$list"
	: >"$CURRENT_LIST"
	while read -r mod; do
		mod="${mod%%#*}"
		mod="$(echo "$mod" | tr -d '[:space:]')"
		[ -n "$mod" ] || continue
		rel="$(awk -F: -v m="/$mod.ko" 'substr($1, length($1) - length(m) + 1) == m { print $1; exit }' "$MODDEP")"
		[ -n "$rel" ] || die "kernel $KVER has no module $mod (hack/guest/modules.$list)"
		place "$rel"
	done <"$GUEST_SRC/modules.$list"
done

# /dev/console must exist before /init runs (the kernel opens it for init's stdio), and a
# device node cannot be made without root: append a hand-made newc archive holding it.
newc_entry() { # NAME MODE(octal) RDEV_MAJOR RDEV_MINOR
	local name="$1" namesize pad
	namesize=$((${#name} + 1))
	printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X' \
		0 "$((8#$2))" 0 0 1 0 0 0 0 "$3" "$4" "$namesize" 0
	printf '%s\0' "$name"
	pad=$(((4 - (110 + namesize) % 4) % 4))
	head -c "$pad" /dev/zero
}
INITRD="$WORK/initrd.img"
(
	cd "$ROOT"
	find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0
	newc_entry dev/console 020600 5 1
	newc_entry TRAILER!!! 0 0 0
) | gzip -9 -n >"$INITRD"

# --- boot disk ----------------------------------------------------------------------------
mkdir -p "$WORK/boot"
cp "$VMLINUZ" "$WORK/boot/vmlinuz"
cp "$GUEST_SRC/syslinux.cfg" "$WORK/boot/syslinux.cfg"
cp "$INITRD" "$WORK/boot/initrd.img"
# FAT size: the files plus 25% and 2 MiB for syslinux and the file system
kib="$(du -sk "$WORK/boot" | cut -f1)"
kib=$(((kib * 5 / 4 + 2048 + 1023) / 1024 * 1024))
RAW="$WORK/boot.img"
"$MKFS_VFAT" -C -n CAPLBOOT "$RAW" "$kib" >/dev/null
syslinux --install "$RAW"
export MTOOLS_SKIP_CHECK=1
mcopy -i "$RAW" "$WORK/boot/vmlinuz" "$WORK/boot/initrd.img" "$WORK/boot/syslinux.cfg" ::/
qemu-img convert -f raw -O qcow2 "$RAW" "$WORK/$IMAGE_NAME"

mkdir -p "$WORK/out"
mv "$WORK/$IMAGE_NAME" "$WORK/out/$IMAGE_NAME"
cat >"$WORK/out/manifest.txt" <<EOF
hash: $HASH
kernel: $KERNEL_PKG $KERNEL_VER ($KVER)
busybox: $BUSYBOX_PKG $BUSYBOX_VER
initrd: $(wc -c <"$INITRD") bytes, gzip
boot fat: $kib KiB
modules.boot: $(tr '\n' ' ' <"$ROOT/etc/capl/modules.boot")
modules.cidata: $(tr '\n' ' ' <"$ROOT/etc/capl/modules.cidata")
EOF
# publish atomically: a concurrent build of the same inputs leaves one complete directory
rm -rf "$OUT.old"
if [ -d "$OUT" ]; then mv "$OUT" "$OUT.old"; fi
mv "$WORK/out" "$OUT"
rm -rf "$OUT.old"
note "guest image built in $((SECONDS - t0)) s: $(du -h "$OUT/$IMAGE_NAME" | cut -f1) ($OUT)"
echo "$OUT/$IMAGE_NAME"
