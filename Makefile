# gpulet — build, run and test. The README names only `make run` and `make test`.
GO        ?= go
BIN       := bin
# go-nvml's header marks some NVML calls deprecated; gpulet does not use them.
export CGO_CFLAGS ?= -Wno-deprecated-declarations

# Non-root users get the socket, run dir, state dir and view under ./.run.
LOCAL     := $(CURDIR)/.run
ifeq ($(shell id -u),0)
RUN_FLAGS ?=
else
RUN_FLAGS ?= --socket-group= --socket $(LOCAL)/gpulet.sock --run-dir $(LOCAL) --state-dir $(LOCAL)/state --mount $(LOCAL)/view
endif

.PHONY: all build run test test-deps bench fuzz vet clean

all: build

build:
	$(GO) build -o $(BIN)/gpuletd ./cmd/gpuletd
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gpurun ./cmd/gpurun
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gpulet ./cmd/gpulet

run: build
	@./scripts/run-banner.sh "$(RUN_FLAGS)"
	./$(BIN)/gpuletd $(RUN_FLAGS)

test-deps:
	@./scripts/install-test-deps.sh

STATICCHECK ?= $(shell command -v staticcheck || echo $$($(GO) env GOPATH)/bin/staticcheck)

test: test-deps
	$(GO) vet ./...
	$(STATICCHECK) ./...
	$(GO) test -race -timeout 12m ./...

bench: build
	$(GO) test -run '^$$' -bench . -benchmem -timeout 20m ./...

clean:
	rm -rf $(BIN) $(LOCAL)
