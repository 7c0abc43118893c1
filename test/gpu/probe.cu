// probe: the CUDA job of gpulet's real-GPU check (test/gpu/run.sh).
//
//   probe [STEP...]   STEP: MIB (allocate and touch MIB MiB, then free it),
//                     keep:MIB (allocate and touch, and keep it until the end),
//                     spin:MS (a kernel of 8 blocks of 1024 threads per SM, each
//                     spinning MS ms; with fewer SMs it takes more waves),
//                     sleep:MS (wait, holding what was kept)
//
// It prints one JSON line at start (what CUDA sees: SMs, free memory, the MPS
// variables, the time CUDA took to start) and one per step, and exits 0 unless
// CUDA itself could not start (3).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <unistd.h>
#include <cuda_runtime.h>

__global__ void spinKernel(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

static double nowMS() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v ? v : "";
}

static cudaError_t touch(size_t mib, void **out) {
  cudaError_t e = cudaMalloc(out, mib << 20);
  if (e == cudaSuccess) e = cudaMemset(*out, 7, mib << 20);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e;
}

int main(int argc, char **argv) {
  double t0 = nowMS();
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    printf("{\"pid\":%d,\"uid\":%d,\"init_error\":\"%s\"}\n", getpid(), getuid(), cudaGetErrorString(e));
    return 3;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  int clockKHz = 0;
  cudaDeviceGetAttribute(&clockKHz, cudaDevAttrClockRate, 0);
  cudaFree(0);
  double initMS = nowMS() - t0;
  size_t freeB = 0, totalB = 0;
  cudaMemGetInfo(&freeB, &totalB);
  printf("{\"pid\":%d,\"uid\":%d,\"device\":\"%s\",\"sms\":%d,\"init_ms\":%.1f,\"free_mib\":%zu,\"total_mib\":%zu,"
         "\"thread_pct\":\"%s\",\"mem_limit\":\"%s\",\"pipe\":\"%s\",\"visible\":\"%s\",\"lease\":\"%s\"}\n",
         getpid(), getuid(), prop.name, prop.multiProcessorCount, initMS, freeB >> 20, totalB >> 20,
         env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
         env("CUDA_MPS_PIPE_DIRECTORY"), env("CUDA_VISIBLE_DEVICES"), env("GPULET_LEASE_ID"));
  fflush(stdout);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strncmp(a, "spin:", 5)) {
      int ms = atoi(a + 5);
      long long cycles = (long long)clockKHz * ms;
      int blocks = prop.multiProcessorCount * 8;
      spinKernel<<<blocks, 1024>>>(1000);
      cudaDeviceSynchronize();
      double s = nowMS();
      spinKernel<<<blocks, 1024>>>(cycles);
      e = cudaDeviceSynchronize();
      printf("{\"pid\":%d,\"spin_ms\":%d,\"kernel_ms\":%.1f,\"error\":\"%s\"}\n", getpid(), ms, nowMS() - s, cudaGetErrorString(e));
    } else if (!strncmp(a, "sleep:", 6)) {
      usleep(atoi(a + 6) * 1000);
      printf("{\"pid\":%d,\"slept_ms\":%d}\n", getpid(), atoi(a + 6));
    } else {
      bool keep = !strncmp(a, "keep:", 5);
      size_t mib = strtoull(keep ? a + 5 : a, 0, 10);
      void *p = 0;
      e = touch(mib, &p);
      printf("{\"pid\":%d,\"alloc_mib\":%zu,\"ok\":%s,\"error\":\"%s\"}\n", getpid(), mib, e == cudaSuccess ? "true" : "false", cudaGetErrorString(e));
      if (e != cudaSuccess) {
        cudaGetLastError();
      } else if (!keep) {
        cudaFree(p);
      }
    }
    fflush(stdout);
  }
  return 0;
}
