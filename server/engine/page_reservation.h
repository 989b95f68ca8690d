// The compressed pages one request adds to the session layers it writes.
//
// A request first says what each layer it writes must hold (Need), checks
// everything else, then takes every missing page from the pool in one
// allocation (Take): RESOURCE_EXHAUSTED takes none, so a request that fails
// its checks or finds the pool full has changed nothing. Taken pages are
// attached at the end of their layers' pages, where the request's slots
// find them. If the request's launch then fails, ReturnPages detaches them
// again (they are still each layer's last pages: no other request of the
// same wave writes the layer) and frees them, so a failed request changes
// nothing either.
//
// The reservation points at the layers it was given, which must outlive it.
// Not thread-safe: the engine thread owns it.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_PAGE_RESERVATION_H_
#define MLA_OFFLOAD_SERVER_ENGINE_PAGE_RESERVATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/kv_pool.h"
#include "server/engine/session.h"

namespace mla {

class PageReservation {
 public:
  // After the request, `layer` holds `rows` compressed rows; one Need a
  // layer, before Take.
  void Need(LayerKv& layer, int64_t rows);
  // The pages Take will take: those every Need misses.
  int64_t missing() const;
  // Takes the pages every Need misses and attaches them; once.
  absl::Status Take(KvBlockPool& pool);
  // Detaches the pages Take attached and frees them.
  void ReturnPages(KvBlockPool& pool);

 private:
  struct Want {
    LayerKv* layer;
    int64_t missing;  // pages
    int64_t taken;    // attached by Take
  };

  std::vector<Want> wants_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_PAGE_RESERVATION_H_
