#!/usr/bin/env bash
# Builds the release tarball: hack/release.sh OUTDIR VERSION REVISION [stage].
# With "stage" it stops at the tree the tarball is made of, which
# `make install` installs from.
#
# Shaped like containerd's own release (containerd-<version>-linux-amd64.tar.gz):
# bin/ to extract into /usr/local, here with etc/ holding the systemd unit
# and an example config, and a .sha256sum file beside it. Two builds from
# one commit give the same bytes: -trimpath, no VCS time in the binaries
# beyond the commit's, and the tar entries sorted, owned by root and dated
# at the commit.
set -euo pipefail
out=$1 version=$2 revision=$3 only=${4:-}
go=${GO:-go}
goarch=$($go env GOARCH)
name=pullwise-${version#v}-linux-$goarch
stage=$out/$name
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/etc/containerd" "$stage/etc/systemd/system"

flags=(-trimpath)
pw=github.com/pullwise/pullwise/plugin/version
ldflags="-s -w -X $pw.Version=$version -X $pw.Revision=$revision"

# containerd's own version package gets the version plugin/version makes
# (hack/version), in every binary: containerd reads it before any Pullwise
# code runs, and ctr and the shim come from containerd's module.
ctrd_ldflags="-s -w $($go run -ldflags "$ldflags" ./hack/version)"
# containerd links libdeflate statically and glibc dynamically, as
# containerd's own release links glibc.
CGO_ENABLED=1 $go build "${flags[@]}" -ldflags "$ldflags $ctrd_ldflags" -o "$stage/bin/containerd" ./cmd/containerd
# The rest are static, as containerd's shim is: they run wherever the
# daemon does, with no libc to match.
CGO_ENABLED=0 $go build "${flags[@]}" -ldflags "$ldflags" -o "$stage/bin/pullctl" ./cmd/pullctl
ctrd=github.com/containerd/containerd/v2
CGO_ENABLED=0 $go build "${flags[@]}" -ldflags "$ctrd_ldflags" -o "$stage/bin/ctr" $ctrd/cmd/ctr
CGO_ENABLED=0 $go build "${flags[@]}" -ldflags "$ctrd_ldflags" -o "$stage/bin/containerd-shim-runc-v2" $ctrd/cmd/containerd-shim-runc-v2

install -m 0644 contrib/config.toml "$stage/etc/containerd/config.toml"
install -m 0644 contrib/containerd.service "$stage/etc/systemd/system/containerd.service"
[ "$only" = stage ] && { echo "$stage"; exit 0; }

rm -f "$out/$name.tar.gz" "$out/$name.tar.gz.sha256sum"
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
	--format=gnu --mode=u+rwX,go+rX,go-w -C "$stage" -cf - bin etc | gzip -n >"$out/$name.tar.gz"
(cd "$out" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256sum")
echo "$out/$name.tar.gz"
