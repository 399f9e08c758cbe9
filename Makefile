# Pullwise: a containerd build with a smarter image-pull layer.

GO        ?= go
BIN       := $(CURDIR)/bin
# The Pullwise version: a v-tag, or the commit where none exists; ".m" marks
# a modified tree, as in containerd's own Makefile. The upstream containerd
# version and the commit are read from the build itself (plugin/version).
VERSION   ?= $(shell git describe --tags --match 'v[0-9]*' --dirty=.m --always 2>/dev/null || echo dev)
REVISION  ?= $(shell r=$$(git rev-parse HEAD 2>/dev/null) && { git diff --quiet HEAD || r=$$r.m; echo $$r; })
LDFLAGS   := -X github.com/pullwise/pullwise/plugin/version.Version=$(VERSION) -X github.com/pullwise/pullwise/plugin/version.Revision=$(REVISION)
# containerd's own version package, for the binaries built from its module
# and for bin/containerd (hack/version). Evaluated where used.
CTRD_LDFLAGS = $(shell $(GO) run -ldflags '$(LDFLAGS)' ./hack/version)
# Every build and test without this machine's paths in it, as the release
# is built (hack/release.sh): then the daemon, the release's daemon, vet and
# the integration tests share one compiled copy of each package, where two
# kinds of path would compile two (minutes from cold caches).
export GOFLAGS += -trimpath
RUN_DIR   := $(CURDIR)/_run
PROTO_DIR := cri/api/v1alpha1
# Integration tests talk to a real daemon; give them room but stay well inside CI's budget.
INTEGRATION_TIMEOUT ?= 15m
# go test, with every failed test's output repeated at the end of the run: CI
# keeps only the tail of a log, and a failure in a 300-second verbose
# integration run is otherwise thousands of lines above it.
GOTESTSUM := $(GO) tool gotestsum

.PHONY: all build containerd containerd-stock stargz bench bench-quick bench-fleet soak fuzz pullctl ctr shim kubelet run test unit integration kubelet-e2e kubelet-gc proto proto-check vet unit-deps clean release release-stage install deps-build deps-run deps-test

all: build

build: containerd pullctl ctr shim

containerd: deps-build
	$(GO) build -ldflags '$(LDFLAGS) $(CTRD_LDFLAGS)' -o $(BIN)/containerd ./cmd/containerd

pullctl:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/pullctl ./cmd/pullctl

# ctr comes from the pinned containerd module, so it matches the daemon exactly.
ctr:
	$(GO) build -ldflags '$(CTRD_LDFLAGS)' -o $(BIN)/ctr github.com/containerd/containerd/v2/cmd/ctr

# The runc shim, also from the pinned module, for pods and containers in the
# integration tests (runc itself comes from Debian's runc package). The test
# harness puts $(BIN) first in containerd's PATH, so this one is used.
shim:
	$(GO) build -ldflags '$(CTRD_LDFLAGS)' -o $(BIN)/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2

# What each target needs from Debian's packages, installed when missing
# (hack/deps.sh): libdeflate for bin/containerd; runc for pods; protoc for
# the generated-code check; tmux, the real terminal pullctl's bars are
# checked on.
deps-build:
	@hack/deps.sh build libdeflate-dev
deps-run:
	@hack/deps.sh run libdeflate-dev runc
deps-test:
	@hack/deps.sh test libdeflate-dev protobuf-compiler runc tmux iproute2

# Foreground daemon with the example config; root, state and socket stay
# under ./_run so it does not touch a system containerd.
run: deps-run build
	@if [ "$$(id -u)" != 0 ]; then \
		echo "run: needs root, as containerd mounts image snapshots (run 'sudo make run')"; exit 1; fi
	mkdir -p $(RUN_DIR)
	$(BIN)/containerd --config contrib/config.toml \
		--root $(RUN_DIR)/root --state $(RUN_DIR)/state --address $(RUN_DIR)/containerd.sock

# Pullwise at work on this machine alone: loopback registry and mirror,
# containerd and pullctl, everything under ./_demo and stopped on exit or ^C.
.PHONY: demo
demo: build
	@if [ "$$(id -u)" != 0 ]; then \
		echo "demo: needs root, as containerd mounts image snapshots (run 'sudo make demo')"; exit 1; fi
	$(GO) build -o $(BIN)/pullwise-demo ./hack/demo
	$(BIN)/pullwise-demo -dir $(CURDIR)/_demo -bin $(BIN) -config contrib/config.toml

# The release tarball, shaped like containerd's, and its checksum, under
# ./_release (hack/release.sh): pullwise-<version>-linux-<arch>.tar.gz.
RELEASE_DIR := $(CURDIR)/_release
RELEASE_TARBALL = $(RELEASE_DIR)/pullwise-$(VERSION:v%=%)-linux-$(shell $(GO) env GOARCH).tar.gz
release: deps-build
	@GO=$(GO) hack/release.sh "$(RELEASE_DIR)" "$(VERSION)" "$(REVISION)"
release-stage: deps-build
	@GO=$(GO) hack/release.sh "$(RELEASE_DIR)" "$(VERSION)" "$(REVISION)" stage

# Installs what the release holds: the binaries under $(PREFIX)/bin, the
# systemd unit where systemd looks for a local admin's units, starting
# $(PREFIX)/bin/containerd, and the example config only where no config is:
# an existing /etc/containerd/config.toml is never overwritten. DESTDIR
# stages it all under another root, for packaging.
PREFIX  ?= /usr/local
DESTDIR ?=
UNITDIR ?= $(PREFIX)/lib/systemd/system
install: release-stage
	@set -e; stage=$(RELEASE_DIR)/pullwise-$(VERSION:v%=%)-linux-$(shell $(GO) env GOARCH); \
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)/etc/containerd; \
	install -m 0755 $$stage/bin/* $(DESTDIR)$(PREFIX)/bin/; \
	sed 's|/usr/local/bin/containerd|$(PREFIX)/bin/containerd|' $$stage/etc/systemd/system/containerd.service \
		>$(DESTDIR)$(UNITDIR)/containerd.service; \
	chmod 0644 $(DESTDIR)$(UNITDIR)/containerd.service; \
	echo "installed $$(ls $$stage/bin | tr '\n' ' ')in $(DESTDIR)$(PREFIX)/bin, containerd.service in $(DESTDIR)$(UNITDIR)"; \
	if [ -e $(DESTDIR)/etc/containerd/config.toml ]; then \
		echo "kept $(DESTDIR)/etc/containerd/config.toml; the example is $$stage/etc/containerd/config.toml"; \
	else \
		install -m 0644 $$stage/etc/containerd/config.toml $(DESTDIR)/etc/containerd/config.toml; \
		echo "installed the example config as $(DESTDIR)/etc/containerd/config.toml"; \
	fi

vet:
	$(GO) vet ./...

unit:
	$(GOTESTSUM) --format standard-quiet -- -race -count=1 $$($(GO) list ./... | grep -v -e '/integration$$' -e '/integration/kubelet$$' -e '/integration/fleet$$')

# What `make unit` compiles, without its tests: every package with -race,
# into the build cache, and nothing linked. `make test` runs it beside the
# integration tests (see test).
unit-deps:
	$(GO) build -race ./...

# Integration needs root (mounts, a real daemon). As root it always runs: it
# never skips silently. Without root it says so and stops here.
integration: build containerd-stock release stargz
	@if [ "$$(id -u)" != 0 ]; then \
		echo "integration: skipped, needs root (run 'sudo make integration')"; exit 0; fi
	PULLWISE_BIN=$(BIN) PULLWISE_RELEASE=$(RELEASE_TARBALL) $(GOTESTSUM) --format standard-verbose -- -count=1 -timeout $(INTEGRATION_TIMEOUT) ./integration/
	# The fleet (N daemons in network namespaces) after, not beside: both
	# would share the 2 CPUs a CI machine has.
	PULLWISE_BIN=$(BIN) $(GOTESTSUM) --format standard-verbose -- -count=1 -timeout 5m ./integration/fleet/

# Kubelet end to end: the real kubelet (make kubelet) on the real daemon,
# root only, like integration, and never skipped as root. The image GC test
# waits for kubelet's fixed 5-minute GC period, so it has its own target.
KUBELET_TIMEOUT ?= 10m
kubelet-e2e: build kubelet
	@if [ "$$(id -u)" != 0 ]; then \
		echo "kubelet-e2e: skipped, needs root (run 'sudo make kubelet-e2e')"; exit 0; fi
	PULLWISE_BIN=$(BIN) $(GOTESTSUM) --format standard-verbose -- -count=1 -timeout $(KUBELET_TIMEOUT) -run Kubelet -skip TestKubeletImageGC ./integration/kubelet/

kubelet-gc: build kubelet
	@if [ "$$(id -u)" != 0 ]; then \
		echo "kubelet-gc: skipped, needs root (run 'sudo make kubelet-gc')"; exit 0; fi
	PULLWISE_BIN=$(BIN) $(GOTESTSUM) --format standard-verbose -- -count=1 -timeout $(KUBELET_TIMEOUT) -run TestKubeletImageGC ./integration/kubelet/

# Two builds take minutes from cold caches, nearly all of it CPU that the
# integration tests leave idle, as they mostly wait on daemons, registries
# and timeouts: kubelet, and the -race copy of every package that the unit
# tests need (unit-deps), a tree of its own. So `make test` starts both
# first, beside the steps, at the lowest CPU priority: nice 19 weighs 15
# against a test's 1024, so they yield the CPU to the tests. The unit tests
# run after the integration tests, once their packages are compiled, and
# before kubelet is waited for (a user without root, for whom kubelet-e2e
# is skipped, sees them without waiting for it). Each build starts as a bash
# job (job control on for that one command) in a process group of its own,
# which the EXIT trap stops when a step fails or the recipe is interrupted;
# the steps stay in make's group, so ^C and a signal to the group reach them
# as before. Not setsid: a new session is a scheduling autogroup of its own,
# where nice no longer weighs against the tests. A SIGKILL of make leaves
# the builds running to their end. Kubelet's output is shown when it is
# waited for, before kubelet-e2e; unit-deps' is dropped, as `make unit`
# reports any error it met.
test: SHELL := /bin/bash
test: deps-test
	@log=$$(mktemp) || exit; \
	set -m; nice -n 19 $(MAKE) --no-print-directory kubelet </dev/null >$$log 2>&1 & kubelet=$$!; \
	nice -n 19 $(MAKE) --no-print-directory unit-deps </dev/null >/dev/null 2>&1 & race=$$!; set +m; \
	trap 'kill -- -$$kubelet -$$race 2>/dev/null; rm -f $$log' EXIT; \
	$(MAKE) --no-print-directory vet proto-check integration || exit; \
	wait $$race; \
	$(MAKE) --no-print-directory unit || exit; \
	echo "make kubelet (started beside the steps above):"; \
	wait $$kubelet; rc=$$?; trap 'rm -f $$log' EXIT; cat $$log; [ $$rc = 0 ] || exit $$rc; \
	$(MAKE) --no-print-directory kubelet-e2e

# Runs every fuzz target for FUZZTIME each, one at a time: go fuzzes one
# target per run. `make unit` already runs their seed corpora (f.Add and
# testdata/fuzz). A failing input is written to the package's
# testdata/fuzz/FuzzX/; commit it as a seed with the fix. FUZZPKG narrows
# the packages, FUZZ the target names (a regexp).
FUZZTIME ?= 60s
FUZZPKG  ?= ./...
FUZZ     ?= .
fuzz:
	@set -e; for pkg in $$($(GO) list $(FUZZPKG) | grep -v -e '/integration'); do \
		for name in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' | grep -E -e '$(FUZZ)'); do \
			echo "== $$pkg $$name ($(FUZZTIME))"; \
			GO=$(GO) hack/fuzz.sh $$pkg $$name $(FUZZTIME); \
		done; \
	done

# Regenerate the committed Go code for the Pullwise API. protoc comes from
# Debian's protobuf-compiler; the Go plugins are pinned as tools in go.mod.
proto:
	@# Debian's protoc predates the debug_redact option runtime.v1 uses on
	@# secrets; it changes nothing in our generated code, so a copy without it
	@# is imported. The module is looked up here, not when make starts: on a
	@# fresh machine it is downloaded first.
	@$(GO) mod download k8s.io/cri-api && cri=$$($(GO) list -m -f '{{.Dir}}' k8s.io/cri-api) && \
	tmp=$$(mktemp -d) && d=$$tmp/staging/src/k8s.io/cri-api/pkg/apis/runtime/v1 && mkdir -p $$d && \
	sed -E 's/ *\[ *debug_redact *= *true *\]//' $$cri/pkg/apis/runtime/v1/api.proto > $$d/api.proto && \
	protoc -I $(PROTO_DIR) -I $$tmp \
		--plugin=protoc-gen-go="$$($(GO) tool -n protoc-gen-go)" \
		--plugin=protoc-gen-go-grpc="$$($(GO) tool -n protoc-gen-go-grpc)" \
		--go_out=$(PROTO_DIR) --go_opt=paths=source_relative \
		--go-grpc_out=$(PROTO_DIR) --go-grpc_opt=paths=source_relative \
		$(PROTO_DIR)/pullwise.proto; rc=$$?; rm -rf $$tmp; exit $$rc

# Fails when the committed generated code differs from what `make proto` makes.
proto-check: proto
	@git diff --exit-code -- $(PROTO_DIR) || { echo "generated code is stale: run 'make proto' and commit"; exit 1; }

clean:
	rm -rf $(BIN) $(RUN_DIR) $(RELEASE_DIR)

# Kubelet for the end-to-end tests, pinned in its own scratch module
# (hack/kubelet) so kubernetes' dependencies stay out of Pullwise's go.mod.
# The version strings are what `kubelet --version` prints; the module zip has
# no git metadata to derive them from. Rebuilt only when the module changes:
# it takes minutes cold.
KUBELET_VERSION := v1.37.2
KUBELET_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBELET_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 \
	-X k8s.io/component-base/version.gitTreeState=clean
kubelet: $(BIN)/kubelet

$(BIN)/kubelet: hack/kubelet/go.mod hack/kubelet/go.sum
	cd hack/kubelet && $(GO) build -ldflags '$(KUBELET_LDFLAGS)' -o $(BIN)/kubelet k8s.io/kubernetes/cmd/kubelet
	@# A wrong version must not be left behind looking up to date.
	$(BIN)/kubelet --version | grep -qx 'Kubernetes $(KUBELET_VERSION)' || { rm -f $@; exit 1; }

# stargz-snapshotter's containerd-stargz-grpc for the lazy-pull tests, from
# a small main in its own module (hack/stargz): the upstream cmd module is
# not served, and stargz's dependencies stay out of Pullwise's go.mod.
stargz:
	cd hack/stargz && $(GO) build -o $(BIN)/containerd-stargz-grpc .

# Stock containerd from the same pinned module, for side-by-side benchmarks.
containerd-stock:
	$(GO) build -o $(BIN)/containerd-stock github.com/containerd/containerd/v2/cmd/containerd

# The soak test at length: more pulls and rounds than the modest one that
# `make integration` runs. Root only, like integration.
SOAK_PULLS ?= 400
SOAK_ROUNDS ?= 12
soak: build
	@if [ "$$(id -u)" != 0 ]; then \
		echo "soak: skipped, needs root (run 'sudo make soak')"; exit 0; fi
	SOAK_PULLS=$(SOAK_PULLS) SOAK_ROUNDS=$(SOAK_ROUNDS) PULLWISE_BIN=$(BIN) \
		$(GOTESTSUM) --format standard-verbose -- -count=1 -timeout 60m -run '^TestSoak$$' ./integration/

# The disk the benchmarks' daemons write layers to: "fresh" (default), a
# new ext4 of their own (hack/benchdisk.sh says why); "host", TMPDIR as it
# is. The fleet benchmark, which measures bytes on the wire, runs on TMPDIR.
BENCH_DISK ?= fresh
BENCH_ON = $(if $(filter fresh,$(BENCH_DISK)),hack/benchdisk.sh,)
# How every benchmark that starts daemons runs go test.
BENCH_GO = $(BENCH_ON) env PULLWISE_BIN=$(BIN) $(GO)

# One small scenario in under two minutes: the node-boot corpus (real
# files, shared base layer) as a CRI burst on loopback, Pullwise against
# stock, each against the CPU bound. Root only, like bench.
bench-quick: build containerd-stock
	PULLWISE_BENCH_PROFILES=loopback $(BENCH_GO) test -count=1 -run '^$$' -bench 'CorpusNodeBoot' -benchtime 1x -timeout 10m ./integration/

# A rollout to a fleet (integration/fleet): 1, 2, 4 and 8 daemons, each
# in its own network namespace, pull one 40 MiB image from a registry in
# another, behind a 400 Mbit/s link, at once and one after another, on
# Pullwise and on stock: registry copies, GETs per blob, node pull times.
# Root only: it makes network namespaces. About 90 s on 2 CPUs.
bench-fleet: containerd containerd-stock
	@if [ "$$(id -u)" != 0 ]; then \
		echo "bench-fleet: needs root, as it makes network namespaces (run 'sudo make bench-fleet')"; exit 1; fi
	PULLWISE_BIN=$(BIN) $(GO) test -count=1 -run '^$$' -bench BenchmarkFleet -benchtime 1x -timeout 20m ./integration/fleet/

# Costs of Pullwise's own code as pulls, images and subscribers grow; then
# Pullwise against stock containerd in one run, on loopback registries;
# then the real-shaped corpus scenarios, CORPUS_COUNT runs of one burst
# each so that the spread shows; then pod start times under a real
# kubelet, one run each on loopback and behind the WAN profile, the corpus
# scenarios with their floor among them. Needs root, like the integration
# tests. An even BENCHTIME: the daemons alternate which goes first, so
# each gets as many bursts after the other's.
BENCHTIME ?= 4x
CORPUS_COUNT ?= 3
bench: build containerd-stock kubelet
	$(GO) test -count=1 -run '^$$' -bench . ./transfer/... ./cri/pinning/
	$(BENCH_GO) test -count=1 -run '^$$' -bench . -skip Corpus -benchtime $(BENCHTIME) -timeout 45m ./integration/
	$(BENCH_GO) test -count=$(CORPUS_COUNT) -run '^$$' -bench Corpus -benchtime 1x -timeout 120m ./integration/
	$(BENCH_GO) test -count=1 -run '^$$' -bench Kubelet -benchtime 1x -timeout 60m ./integration/kubelet/
