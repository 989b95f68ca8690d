#include "proto/transport_settings.h"

#include <grpc/impl/codegen/grpc_types.h>

#include "absl/strings/str_cat.h"

namespace mla {

void TransportSettings::Apply(const std::function<void(const char*, int)>& set) const {
  if (lookahead_bytes >= 0) set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, lookahead_bytes);
  if (max_frame_size >= 0) set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, max_frame_size);
  if (write_buffer_size >= 0) set(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, write_buffer_size);
  if (bdp_probe >= 0) set(GRPC_ARG_HTTP2_BDP_PROBE, bdp_probe);
  if (tcp_min_read_chunk >= 0) set(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, tcp_min_read_chunk);
  if (tcp_max_read_chunk >= 0) set(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, tcp_max_read_chunk);
}

std::string TransportSettings::Describe() const {
  auto text = [](int value) { return value < 0 ? std::string("default") : absl::StrCat(value); };
  return absl::StrCat("lookahead=", text(lookahead_bytes), " frame=", text(max_frame_size),
                      " write_buffer=", text(write_buffer_size), " bdp_probe=", text(bdp_probe),
                      " tcp_read_chunk=[", text(tcp_min_read_chunk), ",",
                      text(tcp_max_read_chunk), "]");
}

TransportSettings DefaultTransport() {
  TransportSettings settings;
  settings.lookahead_bytes = 64 << 20;
  settings.max_frame_size = 16 << 20;
  settings.write_buffer_size = 8 << 20;
  return settings;
}

}  // namespace mla
