// Prints how the linked OpenBLAS runs in parallel: 0 sequential, 1 its own pthreads, 2 OpenMP.
#include <cstdio>

extern "C" int openblas_get_parallel(void);

int main() { std::printf("%d", openblas_get_parallel()); }
