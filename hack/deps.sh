#!/usr/bin/env bash
# Installs the Debian packages a make target needs and the machine lacks:
# hack/deps.sh TARGET PACKAGE...
#
# One apt-get run, only for what is missing, so that `make run` and
# `make test` are each the only command a newcomer types. Where it cannot
# install (not root, no apt-get) it stops at once with the command to run.
set -euo pipefail
target=$1
shift

# has PACKAGE: whether what the package provides is here already. Asked of
# the files the build and the tests use, not of dpkg, so a machine that has
# them from elsewhere is not made to install them again.
has() {
	case $1 in
	# bin/containerd links libdeflate statically: the header and the archive.
	libdeflate-dev) [ -f /usr/include/libdeflate.h ] && compgen -G '/usr/lib/*/libdeflate.a' >/dev/null ;;
	protobuf-compiler) command -v protoc >/dev/null 2>&1 ;;
	# the fleet tests' namespaces, veths and shaped link: ip and tc.
	iproute2) command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 ;;
	*) command -v "$1" >/dev/null 2>&1 ;; # runc, tmux
	esac
}

missing=()
for pkg in "$@"; do
	has "$pkg" || missing+=("$pkg")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
	echo "make $target: missing ${missing[*]} (Debian package names); install them with your distribution's package manager, then run 'make $target' again" >&2
	exit 1
fi
if [ "$(id -u)" != 0 ]; then
	echo "make $target: missing ${missing[*]}; run 'sudo apt-get install -y ${missing[*]}' or 'sudo make $target'" >&2
	exit 1
fi
echo "make $target: installing ${missing[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
# Waits for the dpkg lock rather than fail: `make -j` may run two of these.
apt-get -o DPkg::Lock::Timeout=300 update -qq
apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${missing[@]}" >/dev/null
