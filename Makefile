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

# The demo needs only the `precis` binary, not the test executables. Where `nvidia-smi` finds
# no GPU, it needs no CUDA code either: it builds a CPU-only binary in $(CPU_BUILD_DIR)/ (no
# CUDA, no tests), its own folder so that $(BUILD_DIR)/ keeps compiling the CUDA code for
# `make test`. Each `make demo` starts the run over (checkpoint.overwrite: a run folder with
# checkpoints is otherwise refused).
CPU_BUILD_DIR ?= build-cpu

demo: setup
	@if nvidia-smi -L >/dev/null 2>&1; then dir=$(BUILD_DIR); flags=""; \
	else dir=$(CPU_BUILD_DIR); flags="-DPRECIS_CUDA=OFF -DPRECIS_BUILD_TESTS=OFF"; \
	  echo "demo: no GPU found (nvidia-smi): a CPU-only build in $$dir/"; fi; \
	cmake -S . -B $$dir -DCMAKE_BUILD_TYPE=Release $$flags $(CMAKE_FLAGS) && \
	cmake --build $$dir -j $(JOBS) --target precis_cli && \
	$$dir/precis train examples/configs/shakespeare-char.yaml checkpoint.overwrite=true

format:
	@git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

check-format:
	@bash scripts/check-format.sh

clean:
	@rm -rf $(BUILD_DIR) $(CPU_BUILD_DIR)
