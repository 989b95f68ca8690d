// libFuzzer target: every parser a client's bytes reach before the engine.
//
// Each input is read as all of these at once (one corpus serves them all):
// - an AttendRequest and an AttendResponse by the zero-copy codec
//   (proto/attend_codec.h), and LeadingRequestId;
// - a CreateSessionRequest, AppendKVRequest and CloseSessionRequest by the
//   generated classes, through gRPC's own deserialisation as the server's
//   unary methods receive them.
// Each is read twice: as one slice, and cut into up to four slices at points
// a hash of the input picks, every slice in a heap block of exactly its size
// so that ASan sees a read past any slice's end. Besides the sanitizers it
// checks what the codec promises: both readings agree; a message the codec
// accepts, protobuf accepts too, and the codec writes it back as the bytes
// SerializeToString writes for it (unknown fields dropped); a message one
// byte over the limit is refused; no tensor piece is empty.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "proto/attend_codec.h"
#include "proto/unary_codec.h"
#include "proto/mla_offload.pb.h"

namespace mla::fuzz {
namespace {

namespace pb = ::mla_offload::v1;

constexpr size_t kNoLimit = ~size_t{0};

template <typename... Parts>
[[noreturn]] void Fail(const Parts&... what) {
  std::fprintf(stderr, "codec_fuzzer: %s\n", absl::StrCat(what...).c_str());
  std::abort();
}

// The message is put together only when `holds` is false: this runs
// thousands of times a second.
template <typename... Parts>
void Require(bool holds, const Parts&... what) {
  if (!holds) Fail(what...);
}

// The input cut into slices, each copied into a heap block of its own size.
class SlicedInput {
 public:
  SlicedInput(const uint8_t* data, size_t size) {
    // FNV-1a: the same input is always cut at the same points.
    uint64_t hash = 14695981039346656037u;
    for (size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 1099511628211u;
    std::vector<size_t> cuts = {0};
    for (int i = 0; i < static_cast<int>(hash % 4); ++i) {
      const size_t cut = static_cast<size_t>((hash >> (16 * i + 2)) % (size + 1));
      cuts.push_back(std::max(cuts.back(), cut));
    }
    cuts.push_back(size);
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const size_t length = cuts[i + 1] - cuts[i];
      blocks_.emplace_back(new uint8_t[length]);
      std::memcpy(blocks_.back().get(), data + cuts[i], length);
      slices_.emplace_back(blocks_.back().get(), length, grpc::Slice::STATIC_SLICE);
    }
  }

  // A new buffer over the slices on each call (gRPC's deserialisation
  // consumes the buffer it reads).
  grpc::ByteBuffer Buffer() const { return grpc::ByteBuffer(slices_.data(), slices_.size()); }

 private:
  std::vector<std::unique_ptr<uint8_t[]>> blocks_;
  std::vector<grpc::Slice> slices_;
};

std::string Flatten(const grpc::ByteBuffer& buffer) {
  grpc::Slice slice;
  Require(buffer.DumpToSingleSlice(&slice).ok(), "a serialised message does not dump");
  return std::string(reinterpret_cast<const char*>(slice.begin()), slice.size());
}

void CheckPieces(const std::optional<wire::TensorView>& tensor) {
  if (!tensor.has_value()) return;
  for (const wire::Piece& piece : tensor->pieces) Require(piece.size() > 0, "an empty piece");
  // Its verdict is the engine's business; this only runs it on the shape
  // (any size in each dimension, so that the byte count is computed).
  const std::vector<int64_t> any_size(tensor->shape.size(), -1);
  wire::CheckTensor(*tensor, "tensor", tensor->dtype, any_size).IgnoreError();
}

void CheckTensors(const wire::AttendRequestView& request) {
  for (const auto* tensor : {&request.q, &request.kv, &request.compressed_kv, &request.topk}) {
    CheckPieces(*tensor);
  }
}

void CheckTensors(const wire::AttendResponseView& response) {
  CheckPieces(response.out);
  CheckPieces(response.lse);
}

// One codec parser against itself on both readings and against the
// generated class Message.
template <typename Message, typename View>
void CheckCodec(absl::string_view name, const grpc::ByteBuffer& whole,
                const grpc::ByteBuffer& sliced, const uint8_t* data, size_t size,
                absl::StatusOr<View> (*parse)(const grpc::ByteBuffer&, size_t),
                grpc::ByteBuffer (*serialize)(const View&)) {
  const absl::StatusOr<View> one = parse(whole, kNoLimit);
  const absl::StatusOr<View> cut = parse(sliced, kNoLimit);
  if (one.status() != cut.status()) {
    Fail(name, ": one slice gives '", one.status().ToString(), "', cut gives '",
         cut.status().ToString(), "'");
  }
  if (size > 0) {
    Require(absl::IsInvalidArgument(parse(whole, size - 1).status()), name,
            ": a message one byte over the limit was not refused");
  }
  if (!one.ok()) return;
  CheckTensors(*one);
  CheckTensors(*cut);
  Message message;
  Require(message.ParseFromArray(data, static_cast<int>(size)), name,
          ": the codec accepts what protobuf refuses");
  message.DiscardUnknownFields();
  const std::string expected = message.SerializeAsString();
  const std::string written = Flatten(serialize(*one));
  Require(written == expected, name, ": the codec writes ", written.size(),
          " bytes where SerializeToString writes ", expected.size());
  Require(Flatten(serialize(*cut)) == expected, name,
          ": the codec writes another message from the cut reading");
}

// A unary request as the server's gRPC method receives it, against a parse
// of the flat bytes: the same verdict, and what it parsed writes back and
// reads again as the same message.
template <typename Message>
void CheckUnary(absl::string_view name, const SlicedInput& sliced, const uint8_t* data,
                size_t size) {
  Message received;
  grpc::ByteBuffer buffer = sliced.Buffer();
  const bool ok =
      grpc::SerializationTraits<Message>::Deserialize(&buffer, &received).ok();
  Message flat;
  Require(flat.ParseFromArray(data, static_cast<int>(size)) == ok, name,
          ": gRPC's reading and the flat parse disagree");
  // The server's own reading (proto/unary_codec.h): the same verdict, and
  // a refusal names the message.
  Message ours;
  const absl::Status parsed = wire::ParseUnaryMessage(sliced.Buffer(), &ours);
  Require(parsed.ok() == ok, name, ": ParseUnaryMessage and protobuf disagree: ",
          parsed.ToString());
  Require(ok || (absl::IsInvalidArgument(parsed) &&
                 absl::StartsWith(parsed.message(), Message::descriptor()->name())),
          name, ": a refusal that does not name the message: ", parsed.ToString());
  if (!ok) return;
  Require(ours.SerializeAsString() == flat.SerializeAsString(), name,
          ": ParseUnaryMessage read another message");
  const std::string written = received.SerializeAsString();
  Require(written == flat.SerializeAsString(), name,
          ": gRPC's reading and the flat parse differ");
  Message again;
  Require(again.ParseFromString(written) && again.SerializeAsString() == written, name,
          ": what it wrote does not read back the same");
}

void Run(const uint8_t* data, size_t size) {
  grpc::Slice slice(data, size, grpc::Slice::STATIC_SLICE);
  const grpc::ByteBuffer whole(&slice, 1);
  const SlicedInput sliced(data, size);
  const grpc::ByteBuffer cut = sliced.Buffer();

  CheckCodec<pb::AttendRequest, wire::AttendRequestView>(
      "AttendRequest", whole, cut, data, size,
      [](const grpc::ByteBuffer& buffer, size_t limit) {
        return wire::ParseAttendRequest(buffer, limit);
      },
      &wire::SerializeAttendRequest);
  CheckCodec<pb::AttendResponse>("AttendResponse", whole, cut, data, size,
                                 &wire::ParseAttendResponse, &wire::SerializeAttendResponse);

  // The leading request id needs its varint in the first slice.
  const uint64_t leading = wire::LeadingRequestId(whole);
  Require(leading == 0 || data[0] == 0x08, "a leading request id without field 1 first");
  const uint64_t leading_cut = wire::LeadingRequestId(cut);
  Require(leading_cut == 0 || leading_cut == leading,
          "the cut reading gives another leading request id");

  CheckUnary<pb::CreateSessionRequest>("CreateSessionRequest", sliced, data, size);
  CheckUnary<pb::AppendKVRequest>("AppendKVRequest", sliced, data, size);
  CheckUnary<pb::CloseSessionRequest>("CloseSessionRequest", sliced, data, size);
}

}  // namespace
}  // namespace mla::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs every refused UTF-8 string; the verdicts are what count.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mla::fuzz::Run(data, size);
  return 0;
}

// Any UBSan report ends the run, also without tools/fuzz.sh's UBSAN_OPTIONS.
extern "C" const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }
