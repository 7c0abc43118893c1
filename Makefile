# gpulet — build, run and test. The README names `make run`, `make test` and `make clean`.
GO        ?= go
BIN       := bin
# go-nvml's header marks some NVML calls deprecated; gpulet does not use them.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
# grpcnotrace leaves out gRPC's request tracing (golang.org/x/net/trace), which
# gpulet never turns on; it brings html/template, whose reflection keeps every
# exported method of the binary, 2.7 MB of gpuletd's 17.5 MB loaded image. The
# e2e harness builds with the same tags (test/e2e/harness.go BuildTags).
BUILD_TAGS := grpcnotrace
# --version prints the module version and commit that Go records in each
# binary from the git checkout it is built in; -buildvcs=auto asks for that
# even where GOFLAGS turns it off, and builds without it outside a checkout.
BUILD_FLAGS := -tags $(BUILD_TAGS) -buildvcs=auto

# Where make run keeps gpuletd's files (scripts/run.sh says more, and prints them).
# As root with RUN_DIR empty: gpuletd's defaults (/run/gpulet, /var/lib/gpulet).
# Otherwise a private instance: socket, run dir and FUSE view in RUN_DIR, which
# must be short for MPS (default $XDG_RUNTIME_DIR/gpulet, else /tmp/gpulet-UID),
# and state in ./.run/state.
LOCAL     := $(CURDIR)/.run
RUN_DIR   ?=
# More gpuletd flags, e.g. RUN_FLAGS='--mps off --sim-gpus 1xT4'; they win.
RUN_FLAGS ?=
# NO_BUILD=1 runs the binaries already in bin/.
NO_BUILD  ?=

.PHONY: all build run test test-deps bench fuzz vet clean install

# make install: binaries, Slurm's hook links, systemd units and the sysusers.d
# entry that makes the socket's group. systemd reads units and sysusers.d entries under /usr/local
# too, so the defaults need no other step than enabling the socket.
PREFIX      ?= /usr/local
DESTDIR     ?=
BINDIR      := $(PREFIX)/bin
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
# Slurm's TaskProlog and Epilog are gpulet under these names (docs/slurm.md).
HOOKDIR     ?= $(PREFIX)/lib/gpulet
HOOKS       := gpulet-slurm-task-prolog gpulet-slurm-task-prolog-batch gpulet-slurm-epilog

BINARIES    := gpuletd gpurun gpulet gpulet-collector gpulet-replay
# What make install takes from bin/: built again only when a source is newer,
# so that `sudo make install` after `make build` needs no Go on root's PATH.
INSTALLED   := $(addprefix $(BIN)/,$(BINARIES))
GO_SOURCES  := go.mod go.sum $(shell find . -name '*.go' ! -name '*_test.go' ! -path './test/*' ! -path './.run/*' 2>/dev/null)

all: build

build:
	$(GO) build $(BUILD_FLAGS) -o $(BIN)/gpuletd ./cmd/gpuletd
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/gpurun ./cmd/gpurun
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/gpulet ./cmd/gpulet
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/gpulet-collector ./cmd/gpulet-collector
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/gpulet-replay ./cmd/gpulet-replay

run: $(if $(NO_BUILD),,build)
	@./scripts/run.sh run $(BIN) '$(LOCAL)' '$(RUN_DIR)' $(RUN_FLAGS)

test-deps:
	@./scripts/install-test-deps.sh

STATICCHECK ?= $(shell command -v staticcheck || echo $$($(GO) env GOPATH)/bin/staticcheck)

test: test-deps
	$(GO) vet ./...
	$(STATICCHECK) ./...
	$(GO) test -race -count=1 -timeout 12m ./...

# make bench: every benchmark of every package, the output kept in BENCH_OUT
# (the TCP flood's with the count it needs, as it skips itself without, and
# BENCH_LONG's in 3 longer rounds), then the goals of docs/BENCHMARKS.md
# judged on it in one table (test/bench/goals; it reads any saved output the
# same way).
BENCH_OUT ?= $(BIN)/bench.txt
# BENCH_LONG is the benchmark whose goal is checked on longer rounds, each
# 20,000 leases: at the default second a round's ratio spreads by ±10%.
BENCH_LONG := LeaseUnderReaders/api-held=10000/paced
# BENCH_K8S runs on the test cluster in rounds of pods, a few seconds each:
# 10 rounds, not as many as a second allows.
BENCH_K8S  := DRAPodStart
bench: SHELL := /bin/bash
bench: build
	set -o pipefail; $(GO) test -run '^$$' -bench . -skip '$(BENCH_LONG)|$(BENCH_K8S)' -benchmem -timeout 20m ./... | tee $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench '$(BENCH_K8S)' -benchtime 10x -timeout 15m ./test/k8s/ | tee -a $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench '$(BENCH_LONG)' -benchtime 20000x -count 3 ./test/bench/ | tee -a $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench LeaseUnderTCPFlood -benchtime 10000x ./test/bench/ | tee -a $(BENCH_OUT)
	$(GO) run ./test/bench/goals $(BENCH_OUT)

# make fuzz: every fuzz target of every package in turn, FUZZTIME each. The
# seed corpora already run in make test; this searches beyond them.
FUZZTIME ?= 10s
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
		for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "== $$pkg $$target"; \
			$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

clean:
	@./scripts/run.sh clean '$(LOCAL)'
	rm -rf $(BIN) '$(LOCAL)'

$(INSTALLED) &: $(GO_SOURCES)
	@command -v $(GO) >/dev/null || { echo "make install: $(BIN)/ is older than the sources and $(GO) is not on PATH: run make build as yourself first" >&2; exit 1; }
	$(MAKE) build

install: $(INSTALLED)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(HOOKDIR)
	install -m 0755 $(INSTALLED) $(DESTDIR)$(BINDIR)/
	for h in $(HOOKS); do ln -sfn $(BINDIR)/gpulet $(DESTDIR)$(HOOKDIR)/$$h; done
	sed 's|/usr/local/bin/gpuletd|$(BINDIR)/gpuletd|' systemd/gpuletd.service > $(DESTDIR)$(UNITDIR)/gpuletd.service
	install -m 0644 systemd/gpuletd.socket $(DESTDIR)$(UNITDIR)/gpuletd.socket
	chmod 0644 $(DESTDIR)$(UNITDIR)/gpuletd.service
	sed 's|/usr/local/bin/gpulet-collector|$(BINDIR)/gpulet-collector|' systemd/gpulet-collector.service > $(DESTDIR)$(UNITDIR)/gpulet-collector.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/gpulet-collector.service
	install -m 0644 systemd/gpulet.sysusers.conf $(DESTDIR)$(SYSUSERSDIR)/gpulet.conf
