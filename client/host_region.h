// A host shared-memory region for the same-host data plane: memory of this
// process that the server on the same host maps once, so that Attend
// messages name their q, kv and compressed rows in it and have their
// answers written into it, instead of carrying the bytes through gRPC.
//
// HostRegion::Create makes a new POSIX shared-memory object with a name of
// its own (shm_open, "/mla-<pid>-<random>", mode 0600: the server must run
// as the same user), sizes and maps it here, and registers it with the
// client's server. The destructor unregisters it (a failure, e.g. a server
// that has gone and dropped it already, is ignored), unmaps it and unlinks
// the name. The Client must outlive the region.
//
// Write tensors into data() and name them with Ref(offset, bytes) in
// AttendInput's *_region fields; an answer written into the region is in
// place when AttendStream::Receive returns it. Bytes a message reads must
// stay unchanged until its answer is received (the server reads them while
// the step runs: changing them can corrupt only this client's answer).
// Not thread-safe for writes into the same bytes; the object itself is
// immutable after Create.
#ifndef MLA_OFFLOAD_CLIENT_HOST_REGION_H_
#define MLA_OFFLOAD_CLIENT_HOST_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/mla_client.h"

namespace mla::client {

class HostRegion {
 public:
  // A region of `bytes` (1 or more) registered with `client`'s server.
  // INVALID_ARGUMENT for a size below 1; the server's error when it refuses
  // (PERMISSION_DENIED from another host, RESOURCE_EXHAUSTED past its
  // limits); INTERNAL when the object cannot be made here. Nothing is left
  // behind on failure.
  static absl::StatusOr<std::unique_ptr<HostRegion>> Create(Client& client, int64_t bytes,
                                                            const CallOptions& call = {});
  ~HostRegion();
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  uint8_t* data() const { return data_; }
  int64_t size() const { return bytes_; }
  uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }

  // Bytes [offset, offset + bytes) of the region; INVALID_ARGUMENT when they
  // do not lie within it (checked without overflow).
  absl::StatusOr<RegionRef> Ref(int64_t offset, int64_t bytes) const;

 private:
  HostRegion(Client& client, std::string name, uint8_t* data, int64_t bytes);

  Client& client_;
  const std::string name_;
  uint8_t* const data_;
  const int64_t bytes_;
  uint64_t id_ = 0;
};

}  // namespace mla::client

#endif  // MLA_OFFLOAD_CLIENT_HOST_REGION_H_
