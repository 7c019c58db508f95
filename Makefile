# capl — developer entry points. `make test` is the one test command: it installs and builds
# everything it needs (idempotently) and then runs every gate and the whole suite.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
export CAPL_CACHE ?= $(HOME)/.cache/capl

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-18s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## install the Debian packages the test bed needs (root or sudo)
	@hack/install-deps.sh

$(VENV)/.stamp: pyproject.toml constraints.txt
	@hack/venv.sh $(PYTHON) $(VENV)
	@touch $@

.PHONY: venv
venv: deps $(VENV)/.stamp ## create .venv with the pinned dependency set

.PHONY: envtest
envtest: ## build kube-apiserver, etcd, kubectl into the cache; prints the directory
	@hack/envtest.sh

.PHONY: ipam
ipam: ## build the Cluster API in-cluster IPAM provider into the cache; prints the directory
	@hack/ipam.sh

.PHONY: capi
capi: ## build the Cluster API core manager and clusterctl into the cache; prints the directory
	@hack/capi.sh

.PHONY: node-bin
node-bin: deps ## build kubelet, kubeadm, containerd 2.x, legacy Ignition... into the cache; prints the directory
	@hack/node-bin.sh

.PHONY: node-image
node-image: deps ## build the real-node image (Debian + kubelet/kubeadm/containerd/Ignition); prints its path
	@hack/node-image.sh

.PHONY: libvirt-host
libvirt-host: deps ## configure and start libvirtd + virtlogd on this machine (no systemd)
	@hack/libvirt-host.sh

.PHONY: multihost-bed
multihost-bed: venv ## start three libvirt hosts in namespaces on one LAN bridge (hack/multihost.sh stop|status)
	@hack/multihost.sh start

.PHONY: guest-image
guest-image: deps ## build the CoreOS stand-in test guest image; prints its path
	@hack/guest-image.sh

.PHONY: crds
crds: venv ## regenerate config/crd/bases from the pydantic models
	@$(PY) -m capl.api.crdgen --out config/crd/bases

.PHONY: lint
lint: venv ## ruff, mypy --strict, import-linter, generated files in sync
	@$(VENV)/bin/ruff check capl tests bench
	@$(VENV)/bin/ruff format --check capl tests bench
	@$(VENV)/bin/mypy
	@$(VENV)/bin/lint-imports
	@$(PY) -m capl.api.crdgen --check config/crd/bases

.PHONY: fmt
fmt: venv ## format the code
	@$(VENV)/bin/ruff format capl tests bench
	@$(VENV)/bin/ruff check --fix capl tests bench

.PHONY: release-manifests
release-manifests: venv ## write the clusterctl local repository under out/ (this version and the next minor)
	@hack/release-manifests.sh

.PHONY: test
test: venv lint ## set everything up, then run every test
	@hack/test.sh

.PHONY: demo-e2e
demo-e2e: venv ## the default (real-node) capl demo end to end, as make demo runs it (not in make test)
	@CAPL_TEST_STAGES=demo hack/test.sh

.PHONY: test-multihost
test-multihost: venv ## the multihost stage alone (in make test too): the three-host bed, bridge mode across hosts, live migration
	@CAPL_TEST_STAGES=multihost hack/test.sh

.PHONY: test-firmware
test-firmware: venv ## UEFI secure boot in a TCG guest, from OVMF's log (not in make test: OVMF with SMM under TCG is slow)
	@CAPL_TEST_STAGES=firmware hack/test.sh

.PHONY: e2e-kcp
e2e-kcp: venv ## a KubeadmControlPlane machine running kubeadm init in a TCG guest, and a worker joining it (not in make test)
	@CAPL_TEST_STAGES=kcp hack/test.sh

.PHONY: e2e-inplace
e2e-inplace: venv ## Cluster API in-place updates through capl's runtime extension: a grown disk in place, a new image by replacement (not in make test)
	@CAPL_TEST_STAGES=inplace hack/test.sh

.PHONY: demo
demo: venv ## run a 3-machine demo cluster on the local libvirtd
	@hack/demo.sh

.PHONY: bench
bench: venv ## run every benchmark (writes bench/results/; the real node and the curve to 10,000 included)
	@hack/bench.sh

.PHONY: bench-scale
bench-scale: venv ## make bench's scaling curve to 10,000 machines and steady window, on their own
	@hack/bench-scale.sh

.PHONY: bench-realnode
bench-realnode: venv ## make bench's real node through capl against a hand-run kubeadm join, on its own
	@hack/bench-realnode.sh

.PHONY: clean
clean: ## remove build outputs in the repository (not the cache)
	rm -rf out .mypy_cache .ruff_cache .pytest_cache
