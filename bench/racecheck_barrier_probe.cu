// racecheck_barrier_probe.cu — which barriers compute-sanitizer's racecheck orders shared
// stores through (NOTES-sm90 "dQ by turns"). Two warpgroups store to one shared address, ordered
// by: 0 bar.arrive -> bar.sync; 1 the same through a third warp (two barriers); 2 bar.sync on
// both sides; 3 nothing (a real race); 4 a bar.sync chain through a third warp; 5 mbarrier
// arrive -> wait; 6 the same through a third warp. Every one but 3 is ordered by PTX's memory
// model. H200, CUDA 13.0 (2026-11-27): racecheck reports 0, 1 and 3, and is clean on 2, 4, 5, 6.
//   nvcc -arch=sm_90a -O2 -o race_probe bench/racecheck_barrier_probe.cu
//   for m in 0 1 2 3 4 5 6; do compute-sanitizer --tool racecheck ./race_probe $m; done
#include <cstdio>
#include <cstdlib>
__device__ __forceinline__ void arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__global__ void k(int mode, float* out) {
  __shared__ float s[128];
  int tid = threadIdx.x, wg = tid / 128, i = tid % 128;
  if (mode == 0) {  // direct: WG0 writes, arrives; WG1 syncs, writes
    if (wg == 0) {
      s[i] = 1.f;
      arrive(1, 256);
    } else if (wg == 1) {
      sync(1, 256);
      s[i] = 2.f;
    }
  } else if (mode == 1) {  // chain through warp 8 (two barriers)
    if (wg == 0) {
      s[i] = 1.f;
      arrive(2, 160);
    } else if (tid >= 256) {
      sync(2, 160);
      arrive(3, 160);
    } else {
      sync(3, 160);
      s[i] = 2.f;
    }
  } else if (mode == 2) {  // both sync
    if (wg == 0) {
      s[i] = 1.f;
      sync(1, 256);
    } else if (wg == 1) {
      sync(1, 256);
      s[i] = 2.f;
    }
  } else if (mode == 4) {  // chain through warp 8, every side bar.sync
    if (wg == 0) {
      s[i] = 1.f;
      sync(2, 160);
    } else if (tid >= 256) {
      sync(2, 160);
      sync(3, 160);
    } else {
      sync(3, 160);
      s[i] = 2.f;
    }
  } else if (mode == 5 || mode == 6) {  // mbarrier: direct (5) or through warp 8 (6)
    __shared__ unsigned long long mb[2];
    if (tid == 0) {
      asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(&mb[0])),
                   "r"(128));
      asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(&mb[1])),
                   "r"(32));
      asm volatile("fence.mbarrier_init.release.cluster;");
    }
    __syncthreads();
    unsigned a = __cvta_generic_to_shared(&mb[0]), b = __cvta_generic_to_shared(&mb[1]);
    auto wait = [](unsigned m) {
      asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], 0; @!p bra W; }" ::"r"(m)
                   : "memory");
    };
    auto arr = [](unsigned m) {
      asm volatile("{ .reg .b64 st; mbarrier.arrive.shared.b64 st, [%0]; }" ::"r"(m) : "memory");
    };
    if (wg == 0) {
      s[i] = 1.f;
      arr(a);
    } else if (tid >= 256) {
      if (mode == 6) {
        wait(a);
        arr(b);
      }
    } else {
      wait(mode == 5 ? a : b);
      s[i] = 2.f;
    }
  } else {  // no barrier: a real race
    if (wg < 2) s[i] = wg;
  }
  __syncthreads();
  if (tid < 128) out[tid] = s[tid];
}
int main(int argc, char** argv) {
  int mode = atoi(argv[1]);
  float* o;
  cudaMalloc(&o, 512);
  k<<<1, 288>>>(mode, o);
  printf("mode %d: %s\n", mode, cudaGetErrorString(cudaDeviceSynchronize()));
}
