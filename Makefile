# dsv4attn — the two commands:
#   make run    set up, build, run the main job (`dsv4 run` over every layer kind)
#   make test   set up, build, run every test (C++ via ctest, Python via pytest)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
DSV4_CUDA ?= AUTO

.PHONY: run test setup configure build clean
run: build
	./$(BUILD)/dsv4 info
	./$(BUILD)/dsv4 info --layouts --block-size 64

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

setup:
	DSV4_CUDA=$(DSV4_CUDA) ./scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja -DDSV4_CUDA=$(DSV4_CUDA) $(CMAKE_ARGS)

configure: setup $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

clean:
	rm -rf $(BUILD)
