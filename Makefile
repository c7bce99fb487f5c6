# LJ Runtime Kit: top-level Makefile. `make help` lists the targets.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help
UV ?= $(shell command -v uv >/dev/null 2>&1 && echo uv || echo python3 -m uv)
# The unit tests mostly wait on subprocesses and sockets: more workers than cores pays.
UNIT_WORKERS ?= 3

##@ General

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z0-9_-]+:.*?##/ { printf "  %-22s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: deps
deps: ## Install everything the tests need (uv, Python deps, Debian packages, Kubernetes binaries)
	bash hack/bootstrap.sh

.PHONY: sync
sync: ## Install the workspace into .venv (re-run after adding a module file)
	bash hack/sync.sh

.PHONY: generate
generate: ## Generate Python and typed stubs from every .proto
	$(UV) run bash hack/generate.sh

.PHONY: check-generated
check-generated: ## Fail when a generated stub is stale
	$(UV) run bash hack/generate.sh --check

.PHONY: check-contract
check-contract: ## Fail when the Runtime contract (proto/ and the Controller's service) lost, renumbered or retyped anything
	$(UV) run python -m lj_runtimekit.proto.internal.contract.compat \
		--released proto/released/runtime_v1.binpb \
		--proto-root proto --proto-root Controller/api/proto \
		lingjun/runtime/v1/runtime.proto config_service.proto

.PHONY: lint
lint: check-generated check-contract ## ruff, mypy --strict, import contracts, generated stubs and contract checks
	$(UV) run ruff check .
	$(UV) run ruff format --check .
	$(UV) run python hack/typecheck.py
	$(UV) run python hack/import_contracts.py

.PHONY: check-floors
check-floors: ## Resolve every direct dependency at its declared floor (uv lowest-direct) in a temporary copy, run the unit tests there
	python3 hack/check_floors.py --workers $(UNIT_WORKERS)

# The tests that need no control plane and build no image (hack/check_floors.py runs the same).
UNIT_MARKERS := not controlplane and not e2e and not images

.PHONY: test
test: deps sync lint check-floors ## Run lint, the dependency floors check and every test (the CI command): the unit tests in UNIT_WORKERS processes, then the control-plane, end-to-end and image tests one at a time
	$(UV) run pytest -m "$(UNIT_MARKERS)" --numprocesses=$(UNIT_WORKERS)
	$(UV) run pytest -m "not ($(UNIT_MARKERS))"

.PHONY: unit
unit: sync ## The fast inner loop: every test that needs no control plane (no Kubernetes binaries built) and builds no image, UNIT_WORKERS processes
	$(UV) run pytest -q -m "$(UNIT_MARKERS)" --numprocesses=$(UNIT_WORKERS)

.PHONY: build
build: ## Build the wheel of every workspace member into dist/
	bash hack/build-wheels.sh

##@ Run

SANDBOX_NODES ?= 4

.PHONY: sandbox
sandbox: ## The local sandbox: control plane + SANDBOX_NODES Lingjun nodes running the real kubelet (hollow nodes), every component, demo; stays up until Ctrl-C (SANDBOX_ARGS=--dra: DRA nodes, --exit-after-demo)
	@t0=$$(date +%s.%N); $(MAKE) --no-print-directory deps sync && \
		$(UV) run lj-sandbox up --nodes $(SANDBOX_NODES) --t0 $$t0 $(SANDBOX_ARGS)

.PHONY: sandbox-down
sandbox-down: ## Stop the sandbox (also a leftover one) and remove its state directory
	$(UV) run lj-sandbox down

.PHONY: test-e2e
test-e2e: ## Run the end-to-end tests on the sandbox bed (tests/e2e)
	bash hack/k8s-tools.sh
	$(UV) run pytest -m e2e tests/e2e

-include hack/mk/*.mk

##@ Benchmarks

.PHONY: bench
bench: deps sync ## Run every benchmark, write bench/results.json and print the table
	@for member in $$(python3 hack/members.py); do \
		if grep -q '^bench:' "$$member/Makefile" 2>/dev/null; then \
			echo "== bench $$member"; $(MAKE) -C "$$member" bench || exit 1; \
		fi; \
	done
	$(UV) run python hack/bench_merge.py
