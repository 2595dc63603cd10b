# PRECIS_OPENBLAS: the CPU's f32/f64 matrix products through OpenBLAS when it is installed
# (Debian: libopenblas-openmp-dev, which scripts/setup.sh installs), Eigen's own GEMM otherwise.
# Eigen hands every dynamic-size product (linear layers, attention tiles, matmul, conv) to sgemm
# or dgemm when EIGEN_USE_BLAS is defined, so no call site changes. OpenBLAS picks its kernels
# for the running CPU when it loads (DYNAMIC_ARCH), so the binary stays portable where Eigen's
# own kernels are compiled for the x86-64 baseline (PRECIS_NATIVE_CPU=OFF).
#
# The definition changes which specialisations of Eigen's product templates exist, so it must
# be the same for every C++ file: it is set here once, for the C++ of the whole project. nvcc's
# files are left without it (as PRECIS_NATIVE_CPU leaves them): their host code uses Eigen's
# scalar types only, never its products, so no product template is instantiated both ways.
#
# Only an OpenBLAS that runs sequentially or on OpenMP's threads is used: the pthread build
# starts its own threads beside OpenMP's, and a product called inside an OpenMP region (the
# attention heads, batched matmul) would then put threads x threads on the cores. The OpenMP
# build follows omp_get_max_threads() and runs single-threaded inside a parallel region.
option(PRECIS_OPENBLAS "Use OpenBLAS for the CPU matrix products when it is found" ON)

set(PRECIS_WITH_OPENBLAS OFF)
if(PRECIS_OPENBLAS)
  find_package(OpenBLAS CONFIG QUIET)
  if(OpenBLAS_FOUND AND OpenBLAS_LIBRARIES)
    try_run(_precis_openblas_ran _precis_openblas_built ${CMAKE_CURRENT_BINARY_DIR}/openblas-check
            ${CMAKE_CURRENT_LIST_DIR}/checks/openblas_parallel.cpp LINK_LIBRARIES ${OpenBLAS_LIBRARIES}
            RUN_OUTPUT_VARIABLE _precis_openblas_parallel)
    if(NOT _precis_openblas_built OR NOT _precis_openblas_ran EQUAL 0)
      precis_report("OpenBLAS" "found ${OpenBLAS_LIBRARIES} but a program linked to it did not run: Eigen's own GEMM")
    elseif(_precis_openblas_parallel STREQUAL "1")
      precis_report("OpenBLAS" "found ${OpenBLAS_LIBRARIES}, the pthread build (its threads would compete with OpenMP's): Eigen's own GEMM; install libopenblas-openmp-dev to use it")
    else()
      set(PRECIS_WITH_OPENBLAS ON)
      add_compile_definitions($<$<COMPILE_LANGUAGE:CXX>:EIGEN_USE_BLAS>)
      set(_precis_openblas_mode "sequential")
      if(_precis_openblas_parallel STREQUAL "2")
        set(_precis_openblas_mode "on OpenMP's threads")
      endif()
      precis_report("OpenBLAS" "found ${OpenBLAS_LIBRARIES} (version ${OpenBLAS_VERSION}, ${_precis_openblas_mode}): the CPU products use it")
    endif()
  else()
    precis_report("OpenBLAS" "not found: the CPU products use Eigen's own GEMM (install libopenblas-openmp-dev for faster ones)")
  endif()
else()
  precis_report("OpenBLAS" "off (PRECIS_OPENBLAS=OFF): the CPU products use Eigen's own GEMM")
endif()
