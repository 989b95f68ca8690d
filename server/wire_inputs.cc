#include "server/wire_inputs.h"

#include <optional>
#include <utility>


namespace mla {
namespace {

// An AttendInput together with the parsed message whose slices it points at.
struct ParsedAttend {
  wire::AttendRequestView view;
  AttendInput input;
};

TensorInput FromView(const std::optional<wire::TensorView>& view) {
  TensorInput input;
  if (!view.has_value()) return input;
  input.present = true;
  input.dtype = static_cast<int>(view->dtype);
  input.shape = view->shape;
  for (const wire::Piece& piece : view->pieces) input.pieces.emplace_back(piece.data(), piece.size());
  return input;
}

}  // namespace

std::shared_ptr<const AttendInput> ToAttendInput(wire::AttendRequestView view, absl::Time arrival) {
  auto parsed = std::make_shared<ParsedAttend>();
  parsed->view = std::move(view);
  const wire::AttendRequestView& v = parsed->view;
  AttendInput& input = parsed->input;
  input.request_id = v.request_id;
  input.layer = v.layer;
  input.head_offset = v.head_offset;
  for (const wire::SegmentView& segment : v.segments) {
    input.segments.push_back({segment.session_id, segment.position, segment.num_tokens,
                              segment.first_compressed_row, segment.num_compressed_rows});
  }
  input.q = FromView(v.q);
  input.kv = FromView(v.kv);
  input.compressed_kv = FromView(v.compressed_kv);
  input.topk = FromView(v.topk);
  input.return_lse = v.return_lse;
  input.derotate_output = v.derotate_output;
  input.arrival = arrival;
  return std::shared_ptr<const AttendInput>(parsed, &parsed->input);
}

}  // namespace mla
