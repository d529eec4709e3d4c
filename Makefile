# The README's two commands. Both work on a fresh machine: they make .venv and install what they need.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
APT_PACKAGES := lld pocl-opencl-icd mesa-vulkan-drivers qemu-user-static mmdebstrap

.PHONY: demo test venv system-deps clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

venv: $(VPY)
	$(VPY) -m pip install -q -e ".[dev]"

# Debian packages for the drivers and toolchain the tests use (only when run as root; else skipped).
system-deps:
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null) \
	      || echo "warning: apt-get could not install$$missing; tests that need them will be skipped"; \
	  fi; \
	else echo "not root: skipping Debian packages ($(APT_PACKAGES)); tests that need them will be skipped"; fi

# Main job: compile ResNet-50 (the onnx package's model) for this CPU, check it against onnxruntime
# and print both latencies (benchmarks/demo.py; also `tilecraft demo`).
demo: venv
	$(VPY) -m benchmarks.run demo

# Tests: everything but the long tuning runs.
test: system-deps venv
	$(VPY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
