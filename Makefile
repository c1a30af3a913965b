# Stateward: every verb bootstraps what it needs (virtualenv, Python deps, control-plane binaries).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_FLAGS ?=
# Pytest workers: the real-node tests make three groups (tests/conftest.py), one per worker,
# each worker with its cluster with real nodes in a host slot of its own (lab/slots.py); the
# rest is spread over all (docs/architecture.md). TEST_WORKERS=1 runs them one by one.
TEST_WORKERS ?= 3

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml local/pyproject.toml
	@echo "==> Creating the virtualenv in $(VENV) and installing Stateward, its local cluster (local/) and the dev tools"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip
	@$(BIN)/pip install --quiet -e '.[dev]' -e ./local
	@touch $@

.PHONY: venv
venv: $(STAMP) ## Create the virtualenv and install the project (once)

.PHONY: binaries
binaries: $(STAMP) ## Host packages, the Kubernetes/node binaries and the images, built once into the cache
	@$(BIN)/stateward local build

.PHONY: run
run: binaries ## Main job: local cluster + operator + a sample PostgresCluster, until Ctrl-C
	@$(BIN)/stateward local run

.PHONY: test
test: binaries ## Every test: unit, integration, e2e (three workers; TEST_WORKERS=1 for one)
	@$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25 $(PYTEST_FLAGS) tests

.PHONY: test-unit
test-unit: $(STAMP) ## Unit tests only (no binaries, seconds)
	@$(BIN)/pytest -m unit $(PYTEST_FLAGS) tests/unit

.PHONY: lint
lint: $(STAMP) ## ruff, mypy --strict and the import-layer contracts
	@$(BIN)/ruff check src local/src lab tests
	@$(BIN)/ruff format --check src local/src lab tests
	@$(BIN)/mypy src local/src
	@$(BIN)/lint-imports

.PHONY: fmt
fmt: $(STAMP) ## Format and autofix
	@$(BIN)/ruff format src local/src lab tests
	@$(BIN)/ruff check --fix src local/src lab tests

.PHONY: manifests
manifests: $(STAMP) ## Regenerate the CRDs and RBAC under config/ from the code
	@$(BIN)/stateward manifests

.PHONY: verify-manifests
verify-manifests: $(STAMP) ## Fail, naming each file, if a generated manifest under config/ is stale
	@$(BIN)/stateward manifests --check

# The project's own kubectl (kustomize built in), against $KUBECONFIG, or else the local
# cluster's kubeconfig when one exists (or else kubectl's default, ~/.kube/config).
KUBECTL = $(shell $(BIN)/python -c 'from stateward_local import binaries; print(binaries.locate().kubectl)')
KUBECONFIG ?= $(wildcard $(CURDIR)/.stateward/local/kubeconfig)
KUBECTL_RUN = KUBECONFIG="$(KUBECONFIG)" $(KUBECTL)

.PHONY: install
install: binaries ## Install the CRDs into the cluster of $KUBECONFIG (default: the local cluster)
	@$(KUBECTL_RUN) apply --server-side -k config/crd

.PHONY: uninstall
uninstall: binaries ## Remove the CRDs, and with them every PostgresCluster, from that cluster
	@$(KUBECTL_RUN) delete --ignore-not-found -k config/crd

.PHONY: deploy
deploy: binaries ## Deploy the operator (CRDs, RBAC, Deployment, Services) from config/default
	@$(KUBECTL_RUN) apply --server-side -k config/default

.PHONY: undeploy
undeploy: binaries ## Remove everything `make deploy` created (CRDs and their objects too)
	@$(KUBECTL_RUN) delete --ignore-not-found -k config/default
	@$(KUBECTL_RUN) delete --ignore-not-found validatingwebhookconfiguration stateward.io

.PHONY: up
up: binaries ## Start the local cluster only
	@$(BIN)/stateward local up

.PHONY: down
down: $(STAMP) ## Stop the local cluster and remove its state
	@$(BIN)/stateward local down

BENCH_FLAGS ?=

.PHONY: bench
bench: bench-nodes bench-dataplane bench-faults bench-backup bench-mariadb ## Benchmarks: real nodes, the data plane, failures (RTO/RPO vs bare Patroni), backups and restore, MariaDB failover, then the operator at 100 and 1000 clusters (kwok); docs/benchmarks.md
	@$(BIN)/python -m bench.run $(BENCH_FLAGS)

.PHONY: bench-nodes
bench-nodes: binaries ## Benchmark real nodes: bring-up, idle cost per node, cost per pod, down
	@$(BIN)/python -m bench.nodes $(BENCH_NODES_FLAGS)

.PHONY: bench-dataplane
bench-dataplane: binaries ## Benchmark the data plane: apply → Ready, switchover and failover write downtime, idle memory, pgbench through the pooler, major upgrade downtime, what TLS costs
	@$(BIN)/python -m bench.dataplane $(BENCH_DATAPLANE_FLAGS)
	@$(BIN)/python -m bench.upgrade $(BENCH_UPGRADE_FLAGS)
	@$(BIN)/python -m bench.tls $(BENCH_TLS_FLAGS)

.PHONY: bench-faults
bench-faults: binaries ## The RTO/RPO table: every fault of the matrix 5 times on one cluster with a writer
	@$(BIN)/python -m bench.faults $(BENCH_FAULTS_FLAGS)

.PHONY: bench-mariadb
bench-mariadb: binaries ## MariaDB Database: every fault of its matrix 5 times under a writer — write downtime, time to a new primary, writes lost, beside PostgreSQL
	@$(BIN)/python -m bench.mariadb $(BENCH_MARIADB_FLAGS)

.PHONY: bench-backup
bench-backup: binaries ## Backup and restore throughput, WAL archive lag, restore time by database size (pgbench scales 10 and 50)
	@$(BIN)/python -m bench.backups $(BENCH_BACKUP_FLAGS)

.PHONY: chaos
chaos: binaries ## Soak: N random faults (default 50) against one cluster with a writer (CHAOS_FLAGS=--engine=mariadb: a Database); exit 1 on any lost write or second primary
	@$(BIN)/python -m bench.chaos $(CHAOS_FLAGS)

.PHONY: bench-patroni
bench-patroni: $(STAMP) ## Reference: bare Patroni on loopback (no Kubernetes), write downtime per fault; etcd from `make binaries`
	@$(BIN)/python -m bench.patroni_lab $(BENCH_PATRONI_FLAGS)

OPERATOR_IMAGE = $(shell $(BIN)/python -c 'from stateward_local import images; print(images.OPERATOR_REF)')

.PHONY: image
image: $(STAMP) ## Build the operator image (ghcr.io/stateward/stateward:VERSION) locally, no registry
	@$(BIN)/stateward local images stateward
	@echo "To push it: docker build -f images/stateward/Containerfile -t $(OPERATOR_IMAGE) . && docker push $(OPERATOR_IMAGE)"
	@echo "  (or buildah bud/push; another registry: helm --set image.repository=REGISTRY/stateward)"

LOCK_FLAGS ?=

.PHONY: lock
lock: $(STAMP) ## Re-lock what the images take from PyPI after a dependency change: images/*/requirements-SUITE.txt, every package with its sha256 (uv; the image build installs them with pip --require-hashes); LOCK_FLAGS=--upgrade for the newest versions
	@$(BIN)/stateward local lock $(LOCK_FLAGS)

.PHONY: images
images: $(STAMP) ## Build the local images (pause, base, instance, operator) without a registry
	@$(BIN)/stateward local images
	@echo "Registry users: docker/buildah build -f images/NAME/Containerfile . (see each file's header)"
