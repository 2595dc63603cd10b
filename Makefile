# Precis: `make demo` trains the demo model, `make test` runs the test suite.
# Both install what they need first (scripts/setup.sh).

BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup configure build test demo clean format

setup:
	@bash scripts/setup.sh

configure:
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: setup build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

demo: setup build
	@$(BUILD_DIR)/precis train examples/configs/shakespeare-char.yaml

format:
	@find core ops nn optim amp distributed models data train cli examples tests bench \
	  -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR)
