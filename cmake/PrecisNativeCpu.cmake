# PRECIS_NATIVE_CPU: compile the C++ for the building machine's CPU (-march=native), so Eigen's
# products and the CPU kernels use its widest vectors and FMA (AVX2, AVX-512) instead of the
# x86-64 baseline's SSE2. The binaries then need a CPU with the same instruction sets: turn it
# OFF for binaries that run elsewhere. Only C++ gets the flag, every C++ file of the project
# alike (Eigen's alignment depends on it: objects built with and without it must not share
# Eigen types); nvcc's device code and host compiler are left as they are.
#
# ccache keys a compilation on its command line, and "-march=native" reads the same on every
# machine: a cache shared between machines with different CPUs would hand one CPU's objects to
# the other. The flag therefore comes with a definition naming what "native" expands to here
# (a hash of the compiler's expanded target options), which only changes the cache key.
# OFF by default: on the H100 machine (GCC 13, AVX-512) a build with it ON gave CPU f32
# convolution gradients 0.5% away from the GPU's (CnnOpsGpu.Conv2dMatchesTheCpu failed; with
# it OFF that test passed), and nvcc's host code is compiled without the flag, so header code
# shared with it is compiled two ways: until that is understood, native code is opt-in.
# GCC assumes by default that float operations may trap (-ftrapping-math), so it will not turn
# a float comparison-and-select (std::min, std::max, a ternary) into vector compares and blends:
# loops with a clamp, such as the GELU's tanh (ops/cpu/gelu.h), then stay scalar. Precis never
# reads the floating-point exception flags, and the flag changes no value (no reassociation,
# no contraction), only which loops vectorise; it is clang's default.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fno-trapping-math>")
endif()

option(PRECIS_NATIVE_CPU "Compile the C++ for this machine's CPU (-march=native); OFF for portable binaries" OFF)

if(PRECIS_NATIVE_CPU)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native PRECIS_COMPILER_HAS_MARCH_NATIVE)
  if(PRECIS_COMPILER_HAS_MARCH_NATIVE)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -march=native -E -v -x c++ /dev/null
                    OUTPUT_QUIET ERROR_VARIABLE _precis_native_expansion)
    string(REGEX MATCHALL "[^\n]*cc1[^\n]*" _precis_native_cc1 "${_precis_native_expansion}")
    string(MD5 _precis_native_id "${_precis_native_cc1}")
    string(SUBSTRING "${_precis_native_id}" 0 12 _precis_native_id)
    # GCC 12 miscompiles AVX-512 code here (a Zen 4 CPU, which GCC 12 knows as znver3 plus the
    # AVX-512 flags): a test's std::vector<int64_t>{1, 1, 1, 0} came out {1, 1, 1, 1} at -O3, and
    # -march=x86-64-v3 or -mno-avx512f built it right (bench/NOTES.md, 2026-11-26). Zen 4 runs
    # AVX-512 on 256-bit units anyway: GCC before 13 gets AVX2 and FMA, not AVX-512.
    set(PRECIS_NATIVE_FLAGS -march=native)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      list(APPEND PRECIS_NATIVE_FLAGS -mno-avx512f)
    endif()
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${PRECIS_NATIVE_FLAGS}>")
    add_compile_definitions($<$<COMPILE_LANGUAGE:CXX>:PRECIS_NATIVE_CPU_ID=${_precis_native_id}>)
    precis_report("native CPU" "${PRECIS_NATIVE_FLAGS} (target options ${_precis_native_id}); PRECIS_NATIVE_CPU=OFF for portable binaries")
  else()
    precis_report("native CPU" "the compiler does not take -march=native: baseline x86-64 code")
  endif()
else()
  precis_report("native CPU" "off (PRECIS_NATIVE_CPU=OFF): baseline code for any CPU of the architecture")
endif()
