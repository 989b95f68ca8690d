// Holds device memory for transport_bench --data_plane=cuda_ipc: CUDA opens
// an IPC handle only in another process than the one that exported it, and
// the bench's server shares the bench's process, so this child process
// makes and exports the memory as a client would.
//
//   cuda_ipc_holder DEVICE FILE
//
// Copies FILE's bytes (the region's first contents) into new device memory
// on GPU DEVICE, prints "HANDLE_HEX DEVICE_UUID" and a newline on stdout,
// and frees the memory and exits once its stdin closes (the bench's end).
// Exit status 1, with the reason on stderr, when any step fails.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "client/cuda_region.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: cuda_ipc_holder DEVICE FILE\n");
    return 2;
  }
  std::ifstream file(argv[2], std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  if (!file.good() && !file.eof()) {
    std::fprintf(stderr, "cuda_ipc_holder: cannot read %s\n", argv[2]);
    return 1;
  }
  void* data = nullptr;
  if (cudaSetDevice(std::atoi(argv[1])) != cudaSuccess ||
      cudaMalloc(&data, std::max<size_t>(bytes.size(), 1)) != cudaSuccess ||
      cudaMemcpy(data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
    std::fprintf(stderr, "cuda_ipc_holder: %zu bytes on GPU %s: %s\n", bytes.size(), argv[1],
                 cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  absl::StatusOr<mla::client::CudaExport> exported = mla::client::ExportCudaAllocation(data);
  if (!exported.ok()) {
    std::fprintf(stderr, "cuda_ipc_holder: %s\n", std::string(exported.status().message()).c_str());
    return 1;
  }
  std::printf("%s %s\n", absl::BytesToHexString(exported->handle).c_str(),
              exported->device_uuid.c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  cudaFree(data);
  return 0;
}
