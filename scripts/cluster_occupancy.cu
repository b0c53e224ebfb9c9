// How many thread-block clusters of 1-16 CTAs can be resident at once on this GPU, when each CTA
// needs a whole SM (about 200 KB of shared memory, as our SM90 GEMM kernels do)? A cluster must
// sit within one GPC, so when a GPC's SM count is not a multiple of the cluster size, fewer than
// SMs / cluster-size clusters fit: a "one full wave" of a clustered persistent kernel is then
// this count, not the SM count. Built and run by scripts/cluster_occupancy.sh.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void probe_kernel(int *p) { extern __shared__ int s[]; if (p) p[0] = s[threadIdx.x]; }
int main() {
  int smem = 200 * 1024;
  cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  printf("SMs %d\n", sms);
  for (int cs : {1, 2, 4, 8, 16}) {
    for (int threads : {256, 384}) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(cs * 64, 1, 1); cfg.blockDim = dim3(threads, 1, 1);
      cfg.dynamicSmemBytes = smem;
      cudaLaunchAttribute attr; attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = cs; attr.val.clusterDim.y = 1; attr.val.clusterDim.z = 1;
      cfg.attrs = &attr; cfg.numAttrs = 1;
      int n = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&n, probe_kernel, &cfg);
      printf("cluster %2d threads %d: max active clusters %d (%d CTAs) %s\n", cs, threads, n, n * cs,
             cudaGetErrorString(e));
    }
  }
  return 0;
}
