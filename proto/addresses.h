// Whether a gRPC address names this host alone, so that no other host
// reaches it: what the server counts as a same-host peer for regions
// (server/regions/region_access.h), the listen addresses it serves on without
// --allow_insecure, and the targets a client may place region-using
// sessions on (client::Cluster).
//
// True for a Unix socket ("unix:PATH", "unix-abstract:NAME") and for TCP
// loopback (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104, "localhost"), as gRPC
// targets and peers write them: "HOST:PORT" or "[V6]:PORT", with or without
// an "ipv4:", "ipv6:" or "dns:///" scheme (peers escape the brackets as %5B
// and %5D). A name that may resolve to this host is not counted, nor an
// address without a port. Pure function; thread-safe.
#ifndef MLA_OFFLOAD_PROTO_ADDRESSES_H_
#define MLA_OFFLOAD_PROTO_ADDRESSES_H_

#include "absl/strings/string_view.h"

namespace mla::wire {

bool IsLoopbackAddress(absl::string_view address);

}  // namespace mla::wire

#endif  // MLA_OFFLOAD_PROTO_ADDRESSES_H_
