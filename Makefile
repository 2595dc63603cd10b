# Precis: `make demo` trains the demo model, `make test` runs the test suite.
# Both install what they need first (scripts/setup.sh).

BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup configure build test test-slow fuzz demo clean format check-format

setup:
	@bash scripts/setup.sh

configure:
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Everything but the end-to-end convergence runs (label `slow`, which CI runs too: make test-slow).
test: setup build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE slow

test-slow: setup build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -L slow

# The libFuzzer targets (tests/fuzz), FUZZ_SECONDS each (default 30), with ASan and UBSan.
fuzz: setup
	@bash scripts/fuzz.sh

# The demo needs only the `precis` binary, not the test executables. Each `make demo` starts
# the run over (checkpoint.overwrite: a run folder with checkpoints is otherwise refused).
demo: setup configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target precis_cli
	@$(BUILD_DIR)/precis train examples/configs/shakespeare-char.yaml checkpoint.overwrite=true

format:
	@git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

check-format:
	@bash scripts/check-format.sh

clean:
	@rm -rf $(BUILD_DIR)
