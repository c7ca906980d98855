# The two commands: `make run` (the main job) and `make test` (everything CI checks).
VENV ?= .venv
PY := $(VENV)/bin/python
PACKAGES := appliance firmware image

.PHONY: setup setup-test run test lint config-sweep bench-engine bench-peers bench-kernel bench-protocol demo-firmware image image-test

setup:
	@bash scripts/setup.sh
	@$(MAKE) -s -C bpf

# Also the tools the tests and benchmarks drive (image build, layered baseline, captures).
setup-test:
	@bash scripts/setup.sh test
	@$(MAKE) -s -C bpf

demo-firmware: setup
	$(PY) -m firmware.toolchain.demo

# MODEL=smollm2 (default), gemma3, or all (every demo model side by side, routed by "model").
run: setup
	$(PY) -m appliance.cli run-demo $(if $(MODEL),--model $(MODEL))

lint: setup-test
	$(VENV)/bin/ruff check $(PACKAGES) tests bench
	$(VENV)/bin/mypy $(PACKAGES)

test: lint
	$(VENV)/bin/pytest -q

bench-engine: setup demo-firmware
	$(PY) -m bench.engine $(ARGS)

# Config options the published checkpoints leave unset, on tiny models of every family, each against
# transformers (tests/engine/test_config_sweep.py; about 22 minutes, not part of `make test`).
config-sweep: setup-test
	$(VENV)/bin/pytest -q -m config_sweep tests/engine/test_config_sweep.py

# Against llama.cpp's own server on the same model (builds llama-server once, about 12 minutes; then about 3).
bench-peers: setup demo-firmware
	$(PY) -m bench.peers $(ARGS)

# The protocol tax: Zerolayer's paths against the layered gateway (nginx, Redis); about 10 minutes.
bench-protocol: setup-test
	$(PY) -m bench.protocol $(ARGS)

bench-kernel: setup
	$(PY) bench/kernel.py

# The appliance image with the demo firmware (image/README.md): ARCH=amd64 (default) or arm64,
# into build/image/ARCH unless OUT says otherwise. Needs root.
ARCH ?= amd64
image: setup-test demo-firmware
	$(PY) -m appliance.cli image build --dev --arch $(ARCH) --firmware "$$($(PY) -m firmware.toolchain.demo)" \
		--out $(or $(OUT),build/image/$(ARCH))

# The whole image test: the amd64 build, its boots under nspawn and QEMU (also part of make test),
# the A/B updates in QEMU and the arm64 root under qemu-user.
image-test: setup-test
	$(VENV)/bin/pytest -q -m '' tests/image/test_image.py tests/image/test_image_boot.py tests/image/test_image_ab.py
