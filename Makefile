# Everything runs from a virtualenv this Makefile creates: `make test` on a fresh machine
# needs nothing else installed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The bench extra (matplotlib, py-spy, grpclib), over the above: make bench-* and make test.
BENCH_STAMP := $(VENV)/.bench-installed
# The versions every Python package of $(VENV) installs at: constraints.txt, made by
# `make lock` from constraints.in. LOCK= (empty) installs the newest the pyproject ranges
# allow instead, upgrading what is there (`make test-latest` does).
LOCK ?= constraints.txt
PINS := $(if $(LOCK),-c $(LOCK),--upgrade --upgrade-strategy eager)
# Where the benchmarks and soaks write their results (RESULTS=DIR: elsewhere, e.g. the
# smoke tier's temporary folder), and where `make simulate` draws its chart.
RESULTS ?= results
SIM_CHART ?= docs/scale-parked.png

.PHONY: help venv system-deps test test-latest check lock lint format run clean
.PHONY: fuzz soak soak-exporters
.PHONY: bench bench-modes bench-real bench-calibrate bench-broker bench-analytics simulate

help:
	@echo "make test         create the virtualenv and run the whole test suite"
	@echo "make check        ruff, mypy, the unit tests and the quick stub-backed tests (under 5 minutes)"
	@echo "make check-pythons the check's tests on Python 3.12 and 3.13 too (CHECK_PYTHONS; make test runs it)"
	@echo "make lock         refresh constraints.txt, the versions .venv installs (LOCK_ARGS=--upgrade-package X)"
	@echo "make test-latest  the whole suite in .venv-latest, at the newest versions the pyproject ranges allow"
	@echo "make run          the proxy on 127.0.0.1:8081 (gRPC) / :8082 (HTTP) with 3 embedded brokers"
	@echo "make stack        name server, 3 brokers, 2 proxies, Prometheus, Pushgateway on 127.0.0.1; Ctrl-C stops"
	@echo "                  (STACK_ARGS=--real: real RocketMQ name server and brokers instead of stubs)"
	@echo "make lint         ruff, mypy (strict on the product, lenient on tests/ and the tools)"
	@echo "make config-doc   write docs/configuration.md from the configuration's code"
	@echo "make bench        all four benchmarks below, one after another (about 30 minutes)"
	@echo "make bench-modes  every receive mode side by side (results/bench; BENCH_ARGS=--help)"
	@echo "make bench-real   the sparse case on 3 real RocketMQ brokers (results/bench-real)"
	@echo "make bench-peer   the Apache and Rust RocketMQ proxies beside ours on real brokers (results/bench-peer)"
	@echo "make bench-fleet-hop  what the hop between sharing proxies costs a message (results/fleet-hop)"
	@echo "make bench-cold   the reported case cold, 20 times per mode: the first message (results/bench-cold)"
	@echo "make bench-calibrate the lean load generator against the official Python client"
	@echo "make bench-broker broker stub throughput and wake-up latency"
	@echo "make bench-storm  thousands of long polls within a second: ours and the Apache proxy (results/bench-storm.json)"
	@echo "make bench-hostile slow and hostile clients against one proxy: its memory, the others' p99 (results/hostile)"
	@echo "make bench-memory what each long poll leaves in memory, answered, empty, cancelled, deadline (results/poll-memory.json)"
	@echo "make bench-analytics the Spark job's records/s on 10 million records, local[2] and a standalone cluster, beside a reference"
	@echo "make simulate     a fleet of proxies on simulated time (docs/scale.md; SIM_ARGS=--help)"
	@echo "make rocketmq     fetch the real RocketMQ jars (rocketmq_local/pom.xml) into .cache/rocketmq"
	@echo "                  and build the client drivers (rocketmq_local/java-client,"
	@echo "                  java-remoting-client, go-remoting-client)"
	@echo "make fuzz         the fuzzers of tests/fuzz with a long budget (FUZZ_EXAMPLES=3000, random)"
	@echo "make soak         the chaos soak, 10 minutes on 3 real brokers, then on stubs (results/soak)"
	@echo "                  (SOAK_CLIENTS=official: the official clients, 30 minutes, results/soak-official)"
	@echo "make bench-registrations what registering the clients costs the brokers (results/bench-registrations.json)"
	@echo "make soak-exporters 3,000 clients' metric exporters over 2 workers with connection aging (results/soak)"
	@echo "                  every bench and soak writes under RESULTS=results; BENCH_ARGS=--help lists a bench's flags"
	@echo "make clean        remove the virtualenv and caches"

# Everything editable: the proxy with its development tools, the broker stub (make run's
# embedded brokers, the tests) and the Spark job (tests/analytics), each its own distribution.
$(STAMP): pyproject.toml broker_stub/pyproject.toml analytics/pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade $(if $(LOCK),-c $(LOCK)) pip
	$(BIN)/pip install --quiet $(PINS) -e '.[dev]' -e ./broker_stub -e ./analytics
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the tests run for real (Prometheus, promtool, the Pushgateway,
# docker-compose, a JRE for PySpark); installs only what is missing.
system-deps:
	scripts/system-deps.sh

# The bench extra too: the smoke tier (tests/smoke) runs every benchmark through make.
# TEST_WORKERS pytest-xdist workers; tests that share a JVM cluster or a module's servers
# stay on one worker (tests/conftest.py). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: system-deps $(STAMP) $(BENCH_STAMP) interop-deps deploy-node-deps rocketmq
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25
	$(MAKE) --no-print-directory check-pythons

# The quick loop while changing the code (about 4 minutes on 2 cores): the lint, then the
# unit tests and the stub-backed tests that take seconds; no real brokers, no official
# clients, no soak, Spark or make-target smoke. `make test` runs all of it and the rest.
CHECK_TESTS := tests/unit tests/integration tests/conformance tests/fuzz bench/tests
check: lint
	$(BIN)/python -m pytest -q -m "not slow and not real and not interop" $(CHECK_TESTS)

# The check's tests on the other Pythons the package claims (requires-python >= 3.11), each
# in its own virtualenv (.venv-3.12, ...); `make test` runs it after the suite. A version
# whose interpreter cannot be found fails (scripts/check-pythons.sh).
CHECK_PYTHONS ?= 3.12 3.13
.PHONY: check-pythons
check-pythons:
	CHECK_TESTS="$(CHECK_TESTS)" TEST_WORKERS=$(TEST_WORKERS) scripts/check-pythons.sh $(CHECK_PYTHONS)

# The whole suite at the newest versions the pyproject ranges allow, not the lock's: its
# own virtualenv, upgraded on every run, so that a release that breaks the project (as
# uvloop 0.23 broke the benchmarks) shows up here first. Then `make lock` takes it in.
LATEST_VENV ?= .venv-latest
test-latest:
	rm -f $(LATEST_VENV)/.installed $(LATEST_VENV)/.bench-installed
	$(MAKE) VENV=$(LATEST_VENV) LOCK= test

# docs/configuration.md from the configuration dataclasses (tests/unit/test_config_doc.py
# fails while it is stale).
.PHONY: config-doc
CONFIG_DOC ?= docs/configuration.md
config-doc: $(STAMP)
	$(BIN)/python -m proxy.config_doc > $(CONFIG_DOC)

# constraints.txt from constraints.in with uv (itself pinned there): one version of every
# package, for every Python and platform the pyproject ranges allow (--universal).
# LOCK_ARGS=--upgrade (the default) takes the newest of each; LOCK_ARGS="--upgrade-package
# NAME" moves one; LOCK_ARGS= keeps every pin that still fits and adds what is new.
LOCK_ARGS ?= --upgrade
lock:
	test -x $(BIN)/pip || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(if $(wildcard constraints.txt),-c constraints.txt) uv
	$(BIN)/uv pip compile --quiet --universal --python-version 3.11 $(LOCK_ARGS) \
		--no-emit-package rmq-notify-proxy --no-emit-package rmq-broker-stub \
		--no-emit-package rmq-polling-report --custom-compile-command "make lock" \
		constraints.in -o constraints.txt

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# RUN_ARGS adds flags, e.g. RUN_ARGS="--grpc-port 9081 --http-port 9082" (rmq-proxy --help).
run: $(STAMP)
	$(BIN)/rmq-proxy --embedded-brokers 3 --topic TestTopic --topic OrderTopic $(RUN_ARGS)

# Every component a process of its own, on the ports of docs/design.md (STACK_ARGS=--free-ports
# or --base-port N to move them); prints every URL, stops them all on Ctrl-C.
# STACK_ARGS=--real runs real RocketMQ brokers (fetching the jars first).
.PHONY: stack
stack: system-deps $(STAMP) $(if $(findstring --real,$(STACK_ARGS)),rocketmq)
	$(BIN)/python deploy/local/stack.py $(STACK_ARGS)

# The fuzzers of tests/fuzz with a long, random budget (the suite runs them derandomized,
# with a small one); FUZZ_EXAMPLES sets the examples per test.
fuzz: $(STAMP)
	FUZZ_PROFILE=fuzz $(BIN)/python -m pytest -q -p no:cacheprovider -o timeout=0 tests/fuzz

# The chaos soak (docs/reliability.md): real brokers, then stubs (whose killed broker loses
# its messages, reported); SOAK_ARGS adds flags, e.g. SOAK_ARGS="--minutes 30 --seed 2".
# SOAK_CLIENTS=official: the official Python, Java and Node clients instead (bench/soak_official.py),
# 30 minutes on real brokers through three proxies (SOAK_BACKEND=stub: on broker stubs).
SOAK_CLIENTS ?= lean
SOAK_BACKEND ?= real
SOAK_MINUTES ?= $(if $(filter official,$(SOAK_CLIENTS)),30,10)
soak: $(STAMP) rocketmq $(if $(filter official,$(SOAK_CLIENTS)),interop-deps)
ifeq ($(SOAK_CLIENTS),official)
	$(BIN)/python -m bench.soak_official --backend $(SOAK_BACKEND) --minutes $(SOAK_MINUTES) --workdir $(RESULTS)/soak-official/run --out $(RESULTS)/soak-official/$(SOAK_BACKEND).json $(SOAK_ARGS)
else
	$(BIN)/python -m bench.soak --backend real --minutes $(SOAK_MINUTES) --out $(RESULTS)/soak/real.json $(SOAK_ARGS)
	$(BIN)/python -m bench.soak --backend stub --minutes $(SOAK_MINUTES) --out $(RESULTS)/soak/stub.json $(SOAK_ARGS)
endif

# What registering the clients with the brokers costs them: requests per client per minute
# and per lag refresh, for 1 proxy and a fleet of 3 (bench/registration_cost.py).
.PHONY: bench-registrations
bench-registrations: $(STAMP)
	$(BIN)/python -m bench.registration_cost --out $(RESULTS)/bench-registrations.json $(BENCH_ARGS)

# Clients' metric exports, exact at scale: SOAK_EXPORTERS lean exporters over a two-worker
# proxy with connection aging (bench/export_soak.py).
SOAK_EXPORTERS ?= 3000
soak-exporters: $(STAMP)
	$(BIN)/python -m bench.export_soak --exporters $(SOAK_EXPORTERS) --out $(RESULTS)/soak/exporters.json

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet $(PINS) -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# One after another, so that none of them loads the machine under another. BENCH_ARGS is
# for one bench at a time (each has flags of its own).
bench: bench-modes bench-calibrate bench-broker bench-analytics

# The receive modes side by side (about 21 minutes, 4 of them the filtered scenario);
# BENCH_ARGS passes flags, e.g. BENCH_ARGS="--scenarios overhead --profile".
bench-modes: $(BENCH_STAMP)
	$(BIN)/python -m bench.bench_proxy --out $(RESULTS)/bench $(BENCH_ARGS)

# The sparse case on real Apache RocketMQ 5: a real name server and 3 real brokers
# (Profile.BENCH JVMs), modes notify, adaptive, coupled (about 4 minutes).
bench-real: $(BENCH_STAMP) rocketmq
	$(BIN)/python -m bench.bench_proxy --backend real --out $(RESULTS)/bench-real $(BENCH_ARGS)

# The broker stub's throughput and wake-up latency ($(RESULTS)/bench-broker.json).
bench-broker: $(STAMP)
	$(BIN)/python -m bench.bench_broker --json $(RESULTS)/bench-broker.json $(BENCH_ARGS)

# P proxies x B brokers x K keys x C consumers through the real receive code on simulated
# time (docs/scale.md, about 5 minutes); the chart needs matplotlib (the bench extra).
simulate: $(BENCH_STAMP)
	$(BIN)/python -m bench.sim.simulate --out $(RESULTS)/sim $(SIM_ARGS)
	$(BIN)/python -m bench.sim.plot --results $(RESULTS)/sim/results.json --out $(SIM_CHART)

# The Spark job on 10 million generated records, local[2] (generated once into /tmp):
# one run in a cold JVM, two warm; then the same on a standalone cluster
# ($(RESULTS)/bench-analytics.json).
bench-analytics: $(STAMP)
	$(BIN)/python -m bench.bench_analytics --records 10000000 --runs 3 --json $(RESULTS)/bench-analytics.json $(BENCH_ARGS)

# The lean load generator checked once against the official Python SimpleConsumer: the same
# sparse workload through a notify proxy, both side by side ($(RESULTS)/bench/calibration.json).
bench-calibrate: $(BENCH_STAMP) interop-deps
	$(BIN)/python -m bench.calibrate_client --out $(RESULTS)/bench $(BENCH_ARGS)

# A storm of long polls (bench/storm.py): N polls arriving within a second against the
# Apache proxy and ours on real brokers, from a Python and a Node load generator
# (@grpc/grpc-js from bench/storm_node's lock file); BENCH_ARGS="--smoke" on stubs in
# seconds, BENCH_ARGS="--polls 2000,5000,20000" the sizes of docs/performance.md.
STORM_NODE_STAMP := bench/storm_node/node_modules/.installed
.PHONY: bench-storm
bench-storm: $(BENCH_STAMP) rocketmq $(STORM_NODE_STAMP)
	$(BIN)/python -m bench.storm --out $(RESULTS)/bench-storm.json $(BENCH_ARGS)

# Slow and hostile clients (bench/hostile.py; about 3 minutes): one proxy on broker stubs,
# well-behaved producers and consumers through it, and in turn a client holding Telemetry
# streams it never reads, a Heartbeat flood, a Telemetry flood, then all three at once: the
# proxy's RSS and CPU, the good clients' p50/p99 and errors per phase. BENCH_ARGS passes
# flags, e.g. BENCH_ARGS="--seconds 60 --hoard-streams 5000".
.PHONY: bench-hostile
bench-hostile: $(STAMP)
	$(BIN)/python -m bench.hostile --out $(RESULTS)/hostile $(BENCH_ARGS)

# What a parked long poll costs the proxy, object by object (bench/poll_account.py; about a
# minute): the proxy in the benchmark's own process on uvloop, 2,000 polls from client
# processes, RSS, Python allocations by line and live objects by type per poll. Compare the
# RSS with `python -m bench.grpc_floor` (a bare grpcio servicer holding the same calls).
bench-account: $(STAMP)
	$(BIN)/python -m bench.poll_account --out $(RESULTS)/poll-account.json $(BENCH_ARGS)

# What each long poll leaves behind, by how it ends (bench/poll_memory.py; about 20 minutes):
# one notify worker in the benchmark's process on uvloop, two broker stubs, 200,000 polls
# of each kind (answered, empty, cancelled, deadline-expired), 500 at a time over 4
# channels: RSS after warm-up, KB per 1,000 polls, growth over the last half. Exits 1 past
# 50 KB per 1,000 polls or a last half that is not flat. BENCH_ARGS="--polls 20000" is shorter.
.PHONY: bench-memory
bench-memory: $(STAMP)
	$(BIN)/python -m bench.poll_memory --out $(RESULTS)/poll-memory.json $(BENCH_ARGS)

clean: clean-interop
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info $(RMQ_CACHE)
	rm -rf $(DASHBOARD_NODE_DIR)/node_modules $(K8S_NODE_DIR)/node_modules

# --- Real Apache RocketMQ 5 (rocketmq_local): the name server, broker, Apache proxy and
# mqadmin jars with their dependencies, copied from Maven Central into an ignored cache.
# Fetched again only when the pom changes; nothing is downloaded at test time.
RMQ_CACHE ?= .cache/rocketmq
RMQ_STAMP := $(RMQ_CACHE)/.fetched
MVN ?= mvn

.PHONY: rocketmq

$(RMQ_STAMP): rocketmq_local/pom.xml
	@command -v $(MVN) >/dev/null || { echo "rocketmq: Maven ($(MVN)) is required to fetch the RocketMQ jars" >&2; exit 1; }
	rm -rf $(RMQ_CACHE)/lib
	$(MVN) -q -B -f rocketmq_local/pom.xml dependency:copy-dependencies \
		-DoutputDirectory=$(abspath $(RMQ_CACHE))/lib -DincludeScope=runtime \
		|| { echo "rocketmq: could not fetch the RocketMQ jars from Maven Central (see above); the real-broker tests cannot run without them" >&2; exit 1; }
	touch $@

# The official Java client's interop driver (rocketmq_local/java-client): built with its own
# pom into $(RMQ_CACHE)/java-client (jar + lib/), apart from the server jars in lib/ above.
JAVA_CLIENT_DIR := rocketmq_local/java-client
JAVA_CLIENT_OUT := $(RMQ_CACHE)/java-client
JAVA_CLIENT_STAMP := $(JAVA_CLIENT_OUT)/.built

$(JAVA_CLIENT_STAMP): $(JAVA_CLIENT_DIR)/pom.xml $(wildcard $(JAVA_CLIENT_DIR)/src/main/java/*/*.java)
	@command -v $(MVN) >/dev/null || { echo "rocketmq-java-client: Maven ($(MVN)) is required" >&2; exit 1; }
	rm -rf $(JAVA_CLIENT_OUT)
	$(MVN) -q -B -f $(JAVA_CLIENT_DIR)/pom.xml package -Djava.client.out=$(abspath $(JAVA_CLIENT_OUT)) \
		|| { echo "rocketmq-java-client: could not build the Java client driver (see above)" >&2; exit 1; }
	touch $@

.PHONY: rocketmq-java-client
rocketmq-java-client: $(JAVA_CLIENT_STAMP)

# The official Java client's remoting API (rocketmq-client 5.5.0, the 4.x API) as a driver
# of the remoting-port tests (rocketmq_local/java-remoting-client), built the same way.
REMOTING_CLIENT_DIR := rocketmq_local/java-remoting-client
REMOTING_CLIENT_OUT := $(RMQ_CACHE)/java-remoting-client
REMOTING_CLIENT_STAMP := $(REMOTING_CLIENT_OUT)/.built

$(REMOTING_CLIENT_STAMP): $(REMOTING_CLIENT_DIR)/pom.xml $(wildcard $(REMOTING_CLIENT_DIR)/src/main/java/*/*.java)
	@command -v $(MVN) >/dev/null || { echo "rocketmq-java-remoting-client: Maven ($(MVN)) is required" >&2; exit 1; }
	rm -rf $(REMOTING_CLIENT_OUT)
	$(MVN) -q -B -f $(REMOTING_CLIENT_DIR)/pom.xml package -Dremoting.client.out=$(abspath $(REMOTING_CLIENT_OUT)) \
		|| { echo "rocketmq-java-remoting-client: could not build the remoting client driver (see above)" >&2; exit 1; }
	touch $@

.PHONY: rocketmq-java-remoting-client
rocketmq-java-remoting-client: $(REMOTING_CLIENT_STAMP)

# The Go client (rocketmq-client-go v2) as a driver of the remoting-port tests
# (rocketmq_local/go-remoting-client), built from its go.sum with the machine's Go.
GO ?= go
GO_CLIENT_DIR := rocketmq_local/go-remoting-client
GO_CLIENT_BIN := $(RMQ_CACHE)/go-remoting-client/driver

$(GO_CLIENT_BIN): $(GO_CLIENT_DIR)/go.mod $(GO_CLIENT_DIR)/go.sum $(GO_CLIENT_DIR)/main.go
	@command -v $(GO) >/dev/null || { echo "rocketmq-go-remoting-client: Go ($(GO)) is required" >&2; exit 1; }
	cd $(GO_CLIENT_DIR) && $(GO) build -o $(abspath $@) . \
		|| { echo "rocketmq-go-remoting-client: could not build the Go client driver (see above)" >&2; exit 1; }

rocketmq: $(RMQ_STAMP) $(JAVA_CLIENT_STAMP) $(REMOTING_CLIENT_STAMP) $(GO_CLIENT_BIN)

# --- Interop harness: the official RocketMQ 5 clients as separate processes (tests/interop) ---
# The Python client gets its own virtualenv: it bundles generated apache.rocketmq.v2
# descriptors that clash with ours and pins its own protobuf. The Node client is installed
# from the committed package-lock.json. The native C++ client (librocketmq, in PyPI's
# `rocketmq` 0.4.4) gets a virtualenv of its own too: its module is named `rocketmq` as
# well. Stamps keep repeated `make test` runs fast.
INTEROP_VENV ?= .venv-interop
INTEROP_PY_STAMP := $(INTEROP_VENV)/.installed
CPP_VENV := .venv-cpp
CPP_PY_STAMP := $(CPP_VENV)/.installed
INTEROP_NODE_DIR := testkit/official/node
INTEROP_NODE_STAMP := $(INTEROP_NODE_DIR)/node_modules/.installed
NPM ?= npm

.PHONY: interop-deps test-interop clean-interop

# A client's virtualenv: $@ its stamp, $< its requirements.
define client_venv
	$(PYTHON) -m venv $(@D)
	echo '*' > $(@D)/.gitignore
	$(@D)/bin/pip install --quiet --disable-pip-version-check -r $<
	touch $@
endef

$(INTEROP_PY_STAMP): testkit/official/requirements.txt
	$(client_venv)

$(CPP_PY_STAMP): testkit/official/cpp/requirements.txt
	$(client_venv)

# Every Node tool directory (here and below) installs the same way, from its lock file.
%/node_modules/.installed: %/package.json %/package-lock.json
	cd $* && $(NPM) ci --no-audit --no-fund
	touch $@

interop-deps: $(INTEROP_PY_STAMP) $(CPP_PY_STAMP) $(INTEROP_NODE_STAMP)

test-interop: $(STAMP) interop-deps
	$(BIN)/python -m pytest -q -m interop tests/interop

clean-interop:
	rm -rf $(INTEROP_VENV) $(CPP_VENV) $(INTEROP_NODE_DIR)/node_modules

# --- Node tools of tests/deploy, each from its committed package-lock.json: Grafana's
# dashboard types (@grafana/schema) with a TypeScript-to-JSON-Schema generator, and the
# Prometheus Operator's ServiceMonitor validators for the Kubernetes manifests ---
DASHBOARD_NODE_DIR := tests/deploy/node
DASHBOARD_NODE_STAMP := $(DASHBOARD_NODE_DIR)/node_modules/.installed
K8S_NODE_DIR := deploy/k8s/schema
K8S_NODE_STAMP := $(K8S_NODE_DIR)/node_modules/.installed

.PHONY: deploy-node-deps

deploy-node-deps: $(DASHBOARD_NODE_STAMP) $(K8S_NODE_STAMP)

# Head to head with the Apache RocketMQ proxy and the Rust proxy (rocketmq-proxy 1.0.0, built
# with cargo on first use by scripts/rust-proxy.sh, about 10 minutes) on real brokers
# (bench/peer.py; about 40 minutes): the reported case with the official Python client, lite
# topics (official Python lite consumers, 1,000 and 10,000 lite topics), priority messages,
# sparse, busy, idle fan-in, overhead, then our proxy on stubs; it ends with a summary table.
# BENCH_ARGS passes flags (BENCH_ARGS=--help), e.g. BENCH_ARGS="--workers 1,2" for a notify
# proxy of 2 workers beside the others, BENCH_ARGS="--peers apache,ours" without the Rust one.
.PHONY: bench-peer
bench-peer: $(BENCH_STAMP) rocketmq interop-deps
	$(BIN)/python -m bench.peer --out $(RESULTS)/bench-peer $(BENCH_ARGS)

# What the hop between proxies of a sharing fleet costs a message (bench/fleet_hop.py;
# about 8 minutes): the reported case alone, on a fleet's owner, and across the hop.
.PHONY: bench-fleet-hop
bench-fleet-hop: $(BENCH_STAMP) rocketmq interop-deps
	$(BIN)/python -m bench.fleet_hop --out $(RESULTS)/fleet-hop $(BENCH_ARGS)

# The reported case cold (bench/cold.py; about 10 minutes): a fresh proxy, group, topic
# and official consumer per run, 20 runs per mode; the first message's latency and, from
# each proxy's timeline debug log, the stages of the poll that delivered it.
.PHONY: bench-cold
bench-cold: $(BENCH_STAMP) rocketmq interop-deps
	$(BIN)/python -m bench.cold --out $(RESULTS)/bench-cold $(BENCH_ARGS)
