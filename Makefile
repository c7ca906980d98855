# The two commands: `make run` (the main job) and `make test` (everything CI checks).
VENV ?= .venv
PY := $(VENV)/bin/python
PACKAGES := appliance firmware

.PHONY: setup setup-test run test lint bench-engine bench-kernel bench-protocol demo-firmware

setup:
	@bash scripts/setup.sh
	@$(MAKE) -s -C bpf

# Also the tools the tests and benchmarks drive (image build, layered baseline, captures).
setup-test:
	@bash scripts/setup.sh test
	@$(MAKE) -s -C bpf

demo-firmware: setup
	$(PY) -m firmware.demo

run: setup
	$(PY) -m appliance.cli run-demo

lint: setup-test
	$(VENV)/bin/ruff check $(PACKAGES) tests bench
	$(VENV)/bin/mypy $(PACKAGES)

test: lint
	$(VENV)/bin/pytest -q

bench-engine: setup
	$(PY) bench/engine.py

# The protocol tax: Zerolayer's paths against the layered gateway (nginx, Redis); about 10 minutes.
bench-protocol: setup-test
	$(PY) -m bench.protocol $(ARGS)

bench-kernel: setup
	$(PY) bench/kernel.py
