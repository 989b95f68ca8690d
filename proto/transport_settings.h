// The HTTP/2 and TCP settings of one end of an mla-offload channel, in one
// place for the server (server/offload_server.h), the C++ client library,
// the tests and the benchmarks. Tensor messages are megabytes: with gRPC's
// defaults a stream stalls on flow control every 64 KiB, so both ends raise
// the stream window, the frame size and the write buffer (DefaultTransport;
// server/bench/README.md has the measurements behind the values).
//
// A field of -1 leaves gRPC's own default. Plain values; thread-compatible.
#ifndef MLA_OFFLOAD_PROTO_TRANSPORT_SETTINGS_H_
#define MLA_OFFLOAD_PROTO_TRANSPORT_SETTINGS_H_

#include <functional>
#include <string>

namespace mla {

struct TransportSettings {
  int lookahead_bytes = -1;    // GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES
  int max_frame_size = -1;     // GRPC_ARG_HTTP2_MAX_FRAME_SIZE
  int write_buffer_size = -1;  // GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE
  int bdp_probe = -1;          // GRPC_ARG_HTTP2_BDP_PROBE
  int tcp_min_read_chunk = -1;  // GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE
  int tcp_max_read_chunk = -1;  // GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE

  // Calls set(name, value) for each field that is not -1 (a
  // grpc::ChannelArguments::SetInt or ServerBuilder::AddChannelArgument).
  void Apply(const std::function<void(const char*, int)>& set) const;
  // "lookahead=67108864 frame=16777216 ..." ("default" for -1).
  std::string Describe() const;
};

// What the server and the C++ client use: a 64 MiB stream window, 16 MiB
// frames, an 8 MiB write buffer.
TransportSettings DefaultTransport();

}  // namespace mla

#endif  // MLA_OFFLOAD_PROTO_TRANSPORT_SETTINGS_H_
