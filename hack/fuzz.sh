#!/usr/bin/env bash
# Runs one Go fuzz target: hack/fuzz.sh PKG TARGET FUZZTIME.
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context deadline
# exceeded" at the end of -fuzztime without having found anything (a race in
# internal/fuzz, golang/go#75804, fixed in Go 1.27). A failure that wrote no
# new failing input under testdata/fuzz is that race: it is run again once.
# A failure that wrote an input is a real finding and fails at once.
set -uo pipefail
pkg=$1 name=$2 fuzztime=$3
go=${GO:-go}
dir=$($go list -f '{{.Dir}}' "$pkg")/testdata/fuzz/$name
inputs() { ls "$dir" 2>/dev/null | sort; }

for attempt in 1 2; do
	before=$(inputs)
	$go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg" && exit 0
	if [ "$(inputs)" != "$before" ]; then
		echo "fuzz: $name found a failing input in $dir: fix it and commit the input as a seed" >&2
		exit 1
	fi
	echo "fuzz: $name failed without a failing input (Go's fuzz coordinator race, golang/go#75804); attempt $attempt of 2" >&2
done
exit 1
