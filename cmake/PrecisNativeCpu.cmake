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
option(PRECIS_NATIVE_CPU "Compile the C++ for this machine's CPU (-march=native); OFF for portable binaries" ON)

if(PRECIS_NATIVE_CPU)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native PRECIS_COMPILER_HAS_MARCH_NATIVE)
  if(PRECIS_COMPILER_HAS_MARCH_NATIVE)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -march=native -E -v -x c++ /dev/null
                    OUTPUT_QUIET ERROR_VARIABLE _precis_native_expansion)
    string(REGEX MATCHALL "[^\n]*cc1[^\n]*" _precis_native_cc1 "${_precis_native_expansion}")
    string(MD5 _precis_native_id "${_precis_native_cc1}")
    string(SUBSTRING "${_precis_native_id}" 0 12 _precis_native_id)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-march=native>)
    add_compile_definitions($<$<COMPILE_LANGUAGE:CXX>:PRECIS_NATIVE_CPU_ID=${_precis_native_id}>)
    precis_report("native CPU" "-march=native (target options ${_precis_native_id}); PRECIS_NATIVE_CPU=OFF for portable binaries")
  else()
    precis_report("native CPU" "the compiler does not take -march=native: baseline x86-64 code")
  endif()
else()
  precis_report("native CPU" "off (PRECIS_NATIVE_CPU=OFF): baseline code for any CPU of the architecture")
endif()
