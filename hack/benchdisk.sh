#!/usr/bin/env bash
# Runs a command with TMPDIR on a fresh ext4 file system of its own, made in
# a sparse file on a loop device and removed afterwards: hack/benchdisk.sh
# CMD [ARG...]. The benchmarks' daemons, kubelet and registries keep their
# roots under TMPDIR, so this is the disk they write layers to.
#
# Why: a benchmark of unpacking measures the file system under it as much
# as the daemon. On the machine of the 2026-11-27 figures the root file
# system created files at about 0.4 ms of kernel CPU each, ten times a
# fresh ext4 on a loop device beside it, and that cost drifted by half
# again between minutes (docs/benchmarks.md, "The disk under the
# benchmarks"), so a burst there measured the drift more than the daemon.
# A node's own containerd disk is like the fresh one. BENCH_DISK=host in
# the Makefile runs on TMPDIR as it is.
#
# The loop device reaches its file with direct I/O (losetup --direct-io),
# as a node reaches its disk: through one page cache, the ext4's. A
# buffered loop device caches every block again in its file's pages, and
# each flush of it fsyncs the whole file; on one, the daemon that pulled
# later in a run was slower, stock or Pullwise alike, by more than the
# daemons differed (docs/benchmarks.md, "The disk under the benchmarks").
set -euo pipefail
size=${BENCH_DISK_SIZE:-32G}
if [ "$(id -u)" != 0 ]; then
	echo "benchdisk: needs root to mount a loop device" >&2
	exit 1
fi
base=$(mktemp -d "${TMPDIR:-/tmp}/pullwise-benchdisk-XXXXXX")
img=$base/disk.img mnt=$base/mnt
dev=
cleanup() {
	# Lazily: a daemon killed with the run may still hold it a moment.
	# losetup -d on a device still held only marks it to be detached on
	# its last close.
	umount -l "$mnt" 2>/dev/null || true
	if [ -n "$dev" ]; then losetup -d "$dev" 2>/dev/null || true; fi
	rm -rf "$base"
}
trap cleanup EXIT
truncate -s "$size" "$img"
mkfs.ext4 -q -F "$img"
mkdir -p "$mnt"
dev=$(losetup --direct-io=on --find --show "$img")
mount "$dev" "$mnt"
# The kernel falls back to buffered I/O where the file's file system
# cannot take direct I/O at the device's block size.
if [ "$(losetup --list --noheadings --output DIO "$dev" | tr -d ' ')" != 1 ]; then
	echo "benchdisk: $dev fell back to buffered I/O" >&2
	exit 1
fi
chmod 1777 "$mnt"
echo "benchdisk: TMPDIR=$mnt, a fresh ext4 of $size on $dev (direct I/O)" >&2
TMPDIR=$mnt "$@"
