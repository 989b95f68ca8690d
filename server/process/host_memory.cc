#include "server/process/host_memory.h"

#include <malloc.h>

namespace mla {

bool KeepFreedHostMemory() {
  bool ok = mallopt(M_MMAP_THRESHOLD, 64 << 20) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && ok;
  ok = mallopt(M_TOP_PAD, 64 << 20) == 1 && ok;
  return ok;
}

}  // namespace mla
