// Host memory settings of the server process.
#ifndef MLA_OFFLOAD_SERVER_PROCESS_HOST_MEMORY_H_
#define MLA_OFFLOAD_SERVER_PROCESS_HOST_MEMORY_H_

namespace mla {

// Tells glibc malloc to keep freed memory in the process (allocations up to
// 64 MiB come from the heap, not from mmap; the heap is trimmed only above
// 1 GiB free, and grows 64 MiB at a time). Every Attend message makes
// multi-MiB buffers (gRPC's read slices, the batch's host staging and
// output) that are freed once it is answered; without this each one is
// mmapped, faulted in and zeroed by the kernel page by page, and unmapped
// again. Returns false when malloc refused a setting (not glibc's).
// Call it before any thread starts.
bool KeepFreedHostMemory();

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_PROCESS_HOST_MEMORY_H_
