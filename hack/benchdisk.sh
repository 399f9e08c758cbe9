#!/usr/bin/env bash
# Runs a command with TMPDIR on a fresh ext4 file system of its own, made in
# a sparse file on a loop device and removed afterwards: hack/benchdisk.sh
# CMD [ARG...]. The benchmarks' daemons, kubelet and registries keep their
# roots under TMPDIR, so this is the disk they write layers to.
#
# Why: a benchmark of unpacking measures the file system under it as much
# as the daemon. The root file system of the machines this project is
# built on creates files at about 0.4 ms of kernel CPU each, twelve times a
# fresh ext4's, and that cost moves by a factor of two between minutes
# (docs/benchmarks.md, "The disk under the benchmarks"). Every burst there
# was a measurement of that drift. A node's containerd disk behaves like
# the fresh one, so both daemons are measured on that. BENCH_DISK=host in
# the Makefile runs on TMPDIR as it is.
set -euo pipefail
size=${BENCH_DISK_SIZE:-32G}
if [ "$(id -u)" != 0 ]; then
	echo "benchdisk: needs root to mount a loop device" >&2
	exit 1
fi
base=$(mktemp -d "${TMPDIR:-/tmp}/pullwise-benchdisk-XXXXXX")
img=$base/disk.img mnt=$base/mnt
cleanup() {
	umount "$mnt" 2>/dev/null || true
	rm -rf "$base"
}
trap cleanup EXIT
truncate -s "$size" "$img"
mkfs.ext4 -q -F "$img"
mkdir -p "$mnt"
mount -o loop "$img" "$mnt"
chmod 1777 "$mnt"
echo "benchdisk: TMPDIR=$mnt, a fresh ext4 of $size" >&2
TMPDIR=$mnt "$@"
