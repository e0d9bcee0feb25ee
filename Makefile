# sluice — run `make help` for the targets.

SHELL       := bash
GO          ?= go
GOTESTFLAGS ?=
FUZZTIME    ?= 30s
BIN         ?= bin/sluice

.DEFAULT_GOAL := help
.PHONY: help build run test test-long test-skips test-short test-race lint fuzz bench bench-compare generate clean

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Build bin/sluice
	$(GO) build -o $(BIN) ./cmd/sluice

run: ## Run a dev server with the flow-control demo (sluice dev --demo)
	$(GO) run ./cmd/sluice dev --demo

TESTTIMEOUT ?= 20m

test: ## Run the whole suite with the race detector (GOTESTFLAGS=-v adds flags)
	@$(MAKE) --no-print-directory test-skips
	$(GO) test -race -timeout $(TESTTIMEOUT) $(GOTESTFLAGS) ./...

test-long: ## The whole suite with the slowest tests at full size (SLUICE_TEST_LONG=1; CI runs it)
	SLUICE_TEST_LONG=1 $(MAKE) --no-print-directory test

test-skips: ## Say which tests will skip here (no PostgreSQL, no Chromium, no python3)
	@if [ -z "$$SLUICE_TEST_POSTGRES_URL" ]; then \
	  echo "note: SLUICE_TEST_POSTGRES_URL is not set: the PostgreSQL tests skip (e.g. SLUICE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable)"; fi
	@if [ -z "$$SLUICE_CHROME" ] && ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 \
	  && ! command -v google-chrome >/dev/null 2>&1 && ! command -v google-chrome-stable >/dev/null 2>&1 && ! command -v headless-shell >/dev/null 2>&1; then \
	  echo "note: no chromium on PATH: the dashboard's browser tests skip (apt-get install -y chromium, or set SLUICE_CHROME)"; fi
	@if ! command -v python3 >/dev/null 2>&1; then \
	  echo "note: no python3 on PATH: the Python worker's test (test/python) skips"; fi

test-short: ## Run the suite without the slow tests (-short)
	$(GO) test -short $(GOTESTFLAGS) ./...

test-race: ## Same as test: the suite with the race detector
	$(GO) test -race -timeout $(TESTTIMEOUT) $(GOTESTFLAGS) ./...

lint: ## gofmt check, go vet, and staticcheck when installed
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	@if command -v staticcheck >/dev/null 2>&1; then staticcheck ./...; \
	else echo "staticcheck not installed; skipped (go install honnef.co/go/tools/cmd/staticcheck@latest)"; fi

fuzz: ## Run every Fuzz* test for FUZZTIME each (default 30s)
	@set -eo pipefail; \
	targets="$$($(GO) test -list '^Fuzz' ./... | awk '/^Fuzz/ {n = n " " $$1; next} /^ok/ {split(n, a, " "); for (i in a) print $$2 ":" a[i]; n = ""}')"; \
	if [ -z "$$targets" ]; then echo "no fuzz tests found"; exit 0; fi; \
	for t in $$targets; do \
		pkg="$${t%%:*}"; fz="$${t##*:}"; \
		echo "== $$pkg $$fz ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$fz$$" -fuzztime $(FUZZTIME) "$$pkg"; \
	done

bench: ## Run the sluice benchmark (go run ./cmd/sluice bench)
	$(GO) run ./cmd/sluice bench

generate: ## Run go generate ./...
	$(GO) generate ./...

clean: ## Remove build output and the dev database
	rm -rf bin sluice-dev.db sluice-dev.db-wal sluice-dev.db-shm

BENCH_PG    ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
BENCH_FLAGS ?=
RIVER_FLAGS ?=
# BENCH_DB_LATENCY (e.g. 250us) delays each direction between each side and
# PostgreSQL by that much: River connects through `sluice bench proxy`,
# sluice's servers through the same proxy in process (--db-latency).
BENCH_DB_LATENCY ?=

bench-compare: ## Run River (bench/peers/river) then sluice on the same PostgreSQL (BENCH_PG; BENCH_DB_LATENCY=250us: at a distance) and print the ratios
	@set -eo pipefail; tmp="$$(mktemp -d)"; proxy=""; \
	trap 'if [ -n "$$proxy" ]; then kill "$$proxy" 2>/dev/null || true; wait "$$proxy" 2>/dev/null || true; fi; rm -rf "$$tmp"' EXIT; \
	$(GO) build -o "$$tmp/sluice" ./cmd/sluice; \
	river_db='$(BENCH_PG)'; latency=""; \
	if [ -n '$(BENCH_DB_LATENCY)' ]; then \
		"$$tmp/sluice" bench proxy --db '$(BENCH_PG)' --delay '$(BENCH_DB_LATENCY)' > "$$tmp/proxy.url" 2> "$$tmp/proxy.log" & proxy=$$!; \
		for _ in $$(seq 1 100); do [ -s "$$tmp/proxy.url" ] && break; kill -0 "$$proxy" 2>/dev/null || break; sleep 0.1; done; \
		river_db="$$(head -n 1 "$$tmp/proxy.url")"; \
		if [ -z "$$river_db" ]; then echo "sluice bench proxy did not start:" >&2; cat "$$tmp/proxy.log" >&2; exit 1; fi; \
		latency="--db-latency $(BENCH_DB_LATENCY)"; \
		echo "== River through sluice bench proxy ($(BENCH_DB_LATENCY) each way) to $(BENCH_PG)" >&2; \
	else \
		echo "== River: bench/peers/river on $(BENCH_PG)" >&2; \
	fi; \
	(cd bench/peers/river && $(GO) run . --db "$$river_db" -o json $(RIVER_FLAGS)) > "$$tmp/river.json"; \
	echo "== sluice: sluice bench --db $(BENCH_PG) $$latency" >&2; \
	"$$tmp/sluice" bench --db '$(BENCH_PG)' $$latency --only a,b,c,e --compare-with "$$tmp/river.json" $(BENCH_FLAGS)
