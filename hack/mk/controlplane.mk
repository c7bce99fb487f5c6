# Kubernetes control plane for tests, the sandbox and benchmarks.
# Included by the top-level Makefile.

CLUSTER_STATE_DIR ?= /tmp/lj-runtimekit-cluster
CLUSTER_NODES ?= 2

##@ Kubernetes control plane

.PHONY: k8s-tools
k8s-tools: ## Build the pinned etcd, kube-*, kubectl, kwok and helm into the cache (cold: about 9 minutes on 2 cores)
	bash hack/k8s-tools.sh

.PHONY: cluster-up
cluster-up: ## Start etcd + kube-apiserver + controller-manager + scheduler + KWOK in the background
	bash hack/k8s-tools.sh
	$(UV) run lj-envtest cluster-up --state-dir $(CLUSTER_STATE_DIR) --nodes $(CLUSTER_NODES)

.PHONY: cluster-down
cluster-down: ## Stop the background control plane started by cluster-up
	$(UV) run lj-envtest cluster-down --state-dir $(CLUSTER_STATE_DIR)

.PHONY: test-controlplane
test-controlplane: ## Run the envtest harness and control plane tests (tests/controlplane, tests/envtest)
	bash hack/k8s-tools.sh
	$(UV) run pytest tests/controlplane tests/envtest

.PHONY: bench-controlplane
bench-controlplane: ## Measure cold build, warm start and 1000 KWOK nodes into bench/parts/controlplane.json
	bash hack/k8s-tools.sh
	$(UV) run lj-envtest bench --out bench/parts/controlplane.json

K8S_OLDEST_VERSION := $(shell sed -n 's/^K8S_OLDEST_VERSION=//p' hack/versions.env)

.PHONY: test-oldest-k8s
test-oldest-k8s: sync ## Run every control-plane test against the oldest supported Kubernetes (K8S_OLDEST_VERSION), less the kubelet-backed ones (cold tools build: about 8 minutes)
	K8S_VERSION=$(K8S_OLDEST_VERSION) bash hack/k8s-tools.sh
	K8S_VERSION=$(K8S_OLDEST_VERSION) $(UV) run pytest -m "controlplane and not e2e" \
		--ignore=tests/envtest/test_hollow_node.py $(PYTEST_ARGS)
