# dsv4attn — the two commands:
#   make run    set up, build, run the main job (`dsv4 run` over every layer kind)
#   make test   set up, build, run every test (C++ via ctest, Python via pytest, then the
#               packages as users install them: scripts/test_package.sh)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
DSV4_CUDA ?= AUTO

.PHONY: run test package-test setup configure build clean
# The main job: real V4-Flash layer shapes, one layer of each kind (SWA, C4A, C128A), chunked
# prefill of four requests then decode, with request 0 re-checked against the float64 reference.
RUN_ARGS ?= --model v4-flash --layers 0,2,3 --requests 4 --prompt-len 160,256,192,128 \
            --decode-steps 8 --chunk 256 --check
run: build
	./$(BUILD)/dsv4 info
	./$(BUILD)/dsv4 run $(RUN_ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900
	$(MAKE) --no-print-directory pytest
	$(MAKE) --no-print-directory package-test

# `cmake --install` + examples/cpp against it (static, then shared); `pip install .` and
# `pip wheel .` into fresh venvs + examples/python, from outside the source tree.
package-test: build
	DSV4_CUDA=$(DSV4_CUDA) ./scripts/test_package.sh $(BUILD) $(VENV_PYTHON)

setup:
	DSV4_CUDA=$(DSV4_CUDA) DSV4_VENV=$(VENV) ./scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja -DDSV4_CUDA=$(DSV4_CUDA) -DPython_EXECUTABLE=$(VENV_PYTHON) $(CMAKE_ARGS)

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

clean:
	rm -rf $(BUILD)

# ---- Python package (dsv4attn) -----------------------------------------------------------------
# The extension dsv4attn._C is built in $(BUILD) against the venv that `make setup` creates; the
# tests import the package from $(BUILD)/python (the extension plus copies of python/dsv4attn).
VENV ?= .venv
VENV_PYTHON = $(abspath $(VENV))/bin/python
.PHONY: python pytest
python: build
	cmake -S . -B $(BUILD) -DDSV4_PYTHON=ON -DPython_EXECUTABLE=$(VENV_PYTHON) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target _C

pytest: python
	PYTHONPATH=$(BUILD)/python $(VENV_PYTHON) -m pytest -q tests/python
