#include "client/mla_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <random>
#include <utility>

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_callback.h>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/addresses.h"
#include "proto/mla_offload.grpc.pb.h"
#include "proto/transport_settings.h"
#include "proto/wire_reader.h"
#include "proto/wire_writer.h"

namespace mla::client {
namespace {

constexpr char kAttendMethod[] = "/mla_offload.v1.MlaOffload/Attend";
constexpr char kEchoMethod[] = "/mla_offload.v1.MlaOffload/Echo";
constexpr char kAppendKVMethod[] = "/mla_offload.v1.MlaOffload/AppendKV";
constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

// 32 random hexadecimal digits.
std::string NewClientId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(random(), absl::kZeroPad8));
  return id;
}

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return std::chrono::system_clock::time_point::max();
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             absl::ToChronoNanoseconds(timeout));
}

// Counts the messages whose slices still reference caller memory, so that
// whoever promised the caller "not referenced after this returns" can wait
// for gRPC to let go (a write may still be in progress after a call ended
// or was cancelled). Its own mutex: slices are released on any thread,
// possibly while the stream's lock is held.
class ReleaseCounter {
 public:
  // A keep-alive for one message: holds the caller's keep-alive (if any) and
  // counts until gRPC releases the last slice that holds it.
  std::shared_ptr<const void> Guard(std::shared_ptr<const void> caller_keep_alive) {
    {
      absl::MutexLock lock(&mutex_);
      ++live_;
    }
    return std::make_shared<const GuardHolder>(this, std::move(caller_keep_alive));
  }

  void WaitUntilReleased() {
    absl::MutexLock lock(&mutex_);
    mutex_.Await(absl::Condition(+[](int* live) { return *live == 0; }, &live_));
  }

 private:
  struct GuardHolder {
    GuardHolder(ReleaseCounter* counter, std::shared_ptr<const void> keep_alive)
        : counter(counter), keep_alive(std::move(keep_alive)) {}
    ~GuardHolder() {
      absl::MutexLock lock(&counter->mutex_);
      --counter->live_;
    }
    ReleaseCounter* counter;
    std::shared_ptr<const void> keep_alive;
  };

  absl::Mutex mutex_;
  int live_ ABSL_GUARDED_BY(mutex_) = 0;
};

std::vector<wire::Piece> PiecesOf(const std::vector<grpc::Slice>& slices) {
  std::vector<wire::Piece> pieces;
  pieces.reserve(slices.size());
  for (const grpc::Slice& slice : slices) pieces.emplace_back(slice.begin(), slice.size());
  return pieces;
}

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A view of a received tensor as one aligned span of T: the bytes where they
// lie when gRPC delivered them in one aligned piece, else one copy into
// `copy`, made on first use.
template <typename T>
absl::Span<const T> FlatView(const wire::TensorView& view, absl::once_flag& once,
                             std::vector<T>& copy) {
  const size_t count = view.size_bytes() / sizeof(T);
  if (count == 0) return {};
  const std::optional<wire::Piece> piece = view.contiguous();
  if (piece.has_value() && reinterpret_cast<uintptr_t>(piece->data()) % alignof(T) == 0) {
    return absl::MakeConstSpan(reinterpret_cast<const T*>(piece->data()), count);
  }
  absl::call_once(once, [&] {
    copy.resize(count);
    view.CopyTo(copy.data());
  });
  return copy;
}

}  // namespace

absl::Status StatusFromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

absl::string_view HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case HealthStatus::kUnknown:
      break;
  }
  return "UNKNOWN";
}

// ---- Streams.

namespace internal {

// What the answer to an Attend message must hold, as its Send knew it;
// handed back with the answer.
struct ExpectedAnswer {
  std::vector<int64_t> shape;  // out's [T, H, 512]
  bool in_regions = false;     // written into the message's regions, not sent
  bool fp8_output = false;     // out in e4m3fn with UE8M0 out_scales
};

// One bidirectional stream of raw messages: writes queued and sent one at a
// time, reads always posted (so the server is never blocked on answers the
// caller has not taken yet), answers matched to messages in order, and the
// step deadline. AttendStream and EchoStream give the messages meaning.
//
// No gRPC operation is started or cancelled while mutex_ is held: gRPC may
// run a reaction (which takes mutex_) on the thread that starts one. A hold
// keeps the call open while operations may still be started from outside
// reactions (Send); Finish and the destructor release it once no Send is
// between deciding to write and starting the write.
class RawStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  struct Answer {
    uint64_t id = 0;
    grpc::ByteBuffer buffer;
    ExpectedAnswer expected;  // as given to Send
  };

  RawStream(std::string what, const StreamOptions& options)
      : what_(std::move(what)), options_(options) {}

  ~RawStream() override {
    const bool release_hold = TakeHold();
    if (release_hold) {
      context_->TryCancel();
      RemoveHold();
    }
    std::deque<grpc::ByteBuffer> unsent;
    {
      absl::MutexLock lock(&mutex_);
      mutex_.Await(absl::Condition(&done_));
      unsent.swap(writes_);
    }
    unsent.clear();
    // The call keeps the message of a write that failed (cancelled) until
    // the call itself goes, with the context: only then can the last
    // reference to the caller's memory be dropped.
    context_.reset();
    // The caller may free the memory of its messages once this returns.
    released_.WaitUntilReleased();
  }

  // The keep-alive of one message's tensors (see ReleaseCounter).
  std::shared_ptr<const void> Guard(std::shared_ptr<const void> caller_keep_alive) {
    return released_.Guard(std::move(caller_keep_alive));
  }

  void Start(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
             const internal::CallMetadata& metadata) {
    if (options_.stream_timeout != absl::InfiniteDuration()) {
      context_->set_deadline(DeadlineAfter(options_.stream_timeout));
    }
    for (const auto& [key, value] : metadata) context_->AddMetadata(key, value);
    grpc::GenericStub stub(channel);
    stub.PrepareBidiStreamingCall(context_.get(), method, grpc::StubOptions(), this);
    {
      absl::MutexLock lock(&mutex_);
      holding_ = true;
    }
    AddHold();
    StartRead(&read_buffer_);
    StartCall();
  }

  // Numbers the message, builds it with `build(id)` and queues it for
  // writing; waits while max_in_flight messages are unanswered.
  // `expected` comes back with the message's answer.
  template <typename Build>
  absl::StatusOr<uint64_t> Send(Build&& build, ExpectedAnswer expected = {}) {
    grpc::ByteBuffer* start = nullptr;
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mutex_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return !Usable().ok() || reads_done_ ||
               static_cast<int>(unanswered_.size()) < std::max(1, options_.max_in_flight) ||
               Overdue();
      };
      while (!room()) {
        mutex_.AwaitWithDeadline(absl::Condition(&room), unanswered_.front().deadline);
      }
      if (Overdue()) MarkOverdue();
      // The call is ending (OnDone is due, the hold released): its status.
      if (reads_done_) mutex_.Await(absl::Condition(&done_));
      absl::Status usable = Usable();
      if (usable.ok()) {
        id = ++last_id_;
        absl::StatusOr<grpc::ByteBuffer> message = build(id);
        if (!message.ok()) {
          --last_id_;
          return message.status();
        }
        unanswered_.push_back(
            {id, absl::Now() + options_.step_timeout, std::move(expected)});
        writes_.push_back(*std::move(message));
        if (!writing_) {
          writing_ = true;
          start = &writes_.front();
          ++starting_writes_;
        }
      } else if (!cancel_) {
        return usable;
      }
    }
    if (id == 0) {
      CancelIfNeeded();
      return status();
    }
    if (start != nullptr) {
      StartWrite(start);
      bool release_hold = false;
      {
        absl::MutexLock lock(&mutex_);
        --starting_writes_;
        release_hold = ReleaseHoldIfEnded();
      }
      if (release_hold) RemoveHold();
    }
    return id;
  }

  // The oldest answer not yet taken.
  absl::StatusOr<Answer> Receive() {
    {
      absl::MutexLock lock(&mutex_);
      if (answers_.empty() && unanswered_.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat(what_, ": Receive with no message outstanding (Send first)"));
      }
      // Nothing left unanswered while waiting: another thread's Receive
      // took the answer this one was waiting for.
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return !answers_.empty() || unanswered_.empty() || done_ || Overdue();
      };
      while (!ready()) {
        mutex_.AwaitWithDeadline(absl::Condition(&ready), unanswered_.front().deadline);
      }
      if (!answers_.empty()) {
        Answer answer = std::move(answers_.front());
        answers_.pop_front();
        return answer;
      }
      if (unanswered_.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            what_, ": Receive with no message outstanding (another Receive took the last answer)"));
      }
      if (done_) return Ended();
      MarkOverdue();
    }
    CancelIfNeeded();
    return status();
  }

  int outstanding() const {
    absl::MutexLock lock(&mutex_);
    return static_cast<int>(unanswered_.size() + answers_.size());
  }

  absl::Status status() const {
    absl::MutexLock lock(&mutex_);
    return Usable();
  }

  absl::Status Finish() {
    bool writes_done_now = false;
    bool release_hold = false;
    {
      absl::MutexLock lock(&mutex_);
      if (!finishing_) {
        finishing_ = true;
        mutex_.Await(absl::Condition(
            +[](int* starting) { return *starting == 0; }, &starting_writes_));
        // Without the hold (the call already ended on the server's side)
        // no operation may be started any more.
        writes_done_now = !writing_ && holding_;
        release_hold = holding_;
        holding_ = false;
      }
    }
    if (writes_done_now) StartWritesDone();
    if (release_hold) RemoveHold();
    bool ended = false;
    {
      absl::MutexLock lock(&mutex_);
      ended = mutex_.AwaitWithTimeout(absl::Condition(&done_), options_.step_timeout);
      if (!ended && broken_.ok()) {
        broken_ = absl::DeadlineExceededError(absl::StrCat(
            what_, ": the server did not end the stream within ",
            absl::FormatDuration(options_.step_timeout), " of Finish; cancelled"));
      }
    }
    if (!ended) context_->TryCancel();
    absl::MutexLock lock(&mutex_);
    mutex_.Await(absl::Condition(&done_));
    if (!broken_.ok()) return broken_;
    if (!final_status_.ok()) return final_status_;
    if (!unanswered_.empty()) return Ended();
    return absl::OkStatus();
  }

  void OnWriteDone(bool ok) override {
    grpc::ByteBuffer* next = nullptr;
    bool writes_done_now = false;
    bool release_hold = false;
    {
      absl::MutexLock lock(&mutex_);
      writes_.pop_front();
      if (!ok) {
        // The call is over; OnDone says why.
        writes_.clear();
        reads_done_ = true;
        release_hold = ReleaseHoldIfEnded();
      }
      if (!writes_.empty()) {
        next = &writes_.front();
      } else {
        writing_ = false;
        writes_done_now = finishing_ && ok;
      }
    }
    if (next != nullptr) StartWrite(next);
    if (writes_done_now) StartWritesDone();
    if (release_hold) RemoveHold();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The server ended the stream or the connection broke: no answer
      // comes any more. OnDone, with the reason, follows once the hold is
      // released.
      bool release_hold = false;
      {
        absl::MutexLock lock(&mutex_);
        reads_done_ = true;
        release_hold = ReleaseHoldIfEnded();
      }
      if (release_hold) RemoveHold();
      return;
    }
    bool unexpected = false;
    {
      absl::MutexLock lock(&mutex_);
      if (unanswered_.empty()) {
        unexpected = true;
        if (broken_.ok()) {
          broken_ = absl::InternalError(
              absl::StrCat(what_, ": the server sent an answer no message asked for"));
        }
      } else {
        answers_.push_back({unanswered_.front().id, std::move(read_buffer_),
                            std::move(unanswered_.front().expected)});
        unanswered_.pop_front();
        read_buffer_ = grpc::ByteBuffer();
      }
    }
    if (unexpected) {
      context_->TryCancel();
      return;
    }
    StartRead(&read_buffer_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mutex_);
    final_status_ = StatusFromGrpc(status, what_);
    done_ = true;
  }

 private:
  // OK while messages can still be sent and answered.
  absl::Status Usable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (!broken_.ok()) return broken_;
    if (done_) {
      return final_status_.ok()
                 ? absl::FailedPreconditionError(absl::StrCat(what_, ": the stream has ended"))
                 : final_status_;
    }
    if (finishing_) {
      return absl::FailedPreconditionError(absl::StrCat(what_, ": Send after Finish"));
    }
    return absl::OkStatus();
  }

  // Why the oldest message will get no answer, once the call is over: the
  // call's status (UNAVAILABLE when the server went away, ...).
  absl::Status Ended() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (!broken_.ok()) return broken_;
    if (!final_status_.ok()) return final_status_;
    return absl::InternalError(absl::StrCat(what_,
                                            ": the server ended the stream without answering "
                                            "message ",
                                            unanswered_.front().id));
  }

  bool Overdue() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return !unanswered_.empty() && absl::Now() >= unanswered_.front().deadline;
  }

  // The stream fails with DEADLINE_EXCEEDED; CancelIfNeeded, called without
  // the lock, cancels the call.
  void MarkOverdue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (broken_.ok()) {
      broken_ = absl::DeadlineExceededError(absl::StrCat(
          what_, ": message ", unanswered_.front().id, " was not answered within ",
          absl::FormatDuration(options_.step_timeout),
          " of its Send (StreamOptions::step_timeout); the stream is cancelled"));
      cancel_ = true;
    }
  }

  void CancelIfNeeded() ABSL_LOCKS_EXCLUDED(mutex_) {
    bool cancel = false;
    {
      absl::MutexLock lock(&mutex_);
      cancel = cancel_;
      cancel_ = false;
    }
    if (cancel) context_->TryCancel();
  }

  // After the call ended on the server's side: true once, for whoever must
  // release the hold, when no Send is about to start a write (that Send
  // releases it after its StartWrite).
  bool ReleaseHoldIfEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (!reads_done_ || !holding_ || starting_writes_ > 0) return false;
    holding_ = false;
    return true;
  }

  // True once, for whoever must release the hold: no Send is then about to
  // start a write.
  bool TakeHold() ABSL_LOCKS_EXCLUDED(mutex_) {
    absl::MutexLock lock(&mutex_);
    mutex_.Await(absl::Condition(+[](int* starting) { return *starting == 0; },
                                 &starting_writes_));
    const bool held = holding_;
    holding_ = false;
    return held;
  }

  struct Unanswered {
    uint64_t id;
    absl::Time deadline;
    ExpectedAnswer expected;
  };

  const std::string what_;
  const StreamOptions options_;
  ReleaseCounter released_;  // outlives context_ and the buffers below
  // The call's context; dropped by the destructor once the call is done.
  std::unique_ptr<grpc::ClientContext> context_ = std::make_unique<grpc::ClientContext>();
  grpc::ByteBuffer read_buffer_;  // touched only by the read reactions

  mutable absl::Mutex mutex_;
  std::deque<grpc::ByteBuffer> writes_ ABSL_GUARDED_BY(mutex_);
  bool writing_ ABSL_GUARDED_BY(mutex_) = false;
  // Sends between queueing the first write and StartWrite.
  int starting_writes_ ABSL_GUARDED_BY(mutex_) = 0;
  bool finishing_ ABSL_GUARDED_BY(mutex_) = false;
  bool holding_ ABSL_GUARDED_BY(mutex_) = false;
  bool cancel_ ABSL_GUARDED_BY(mutex_) = false;
  // A read or write failed: the call is over on the server's side.
  bool reads_done_ ABSL_GUARDED_BY(mutex_) = false;
  uint64_t last_id_ ABSL_GUARDED_BY(mutex_) = 0;
  std::deque<Unanswered> unanswered_ ABSL_GUARDED_BY(mutex_);
  std::deque<Answer> answers_ ABSL_GUARDED_BY(mutex_);
  absl::Status broken_ ABSL_GUARDED_BY(mutex_);
  absl::Status final_status_ ABSL_GUARDED_BY(mutex_);
  bool done_ ABSL_GUARDED_BY(mutex_) = false;
};

// The connections of one stream (StreamOptions::connections): a RawStream
// on each, the messages spread over them, the answers taken in the order
// sent. A message goes to the connection of the newest message not yet
// received that shares a key with it (its session layers: the server
// orders only one connection's messages), else to the next one in turn.
// Pick, raw(i).Send and Sent (or NotSent) make one Send, from one thread at
// a time; Receive may run meanwhile on another.
class Stripes {
 public:
  struct Answer {
    uint64_t id = 0;  // the stream's: 1, 2, ... in the order sent
    RawStream::Answer raw;
  };

  explicit Stripes(std::vector<std::unique_ptr<RawStream>> raws);
  ~Stripes();

  int Pick(const std::vector<std::string>& keys);
  RawStream& raw(int stripe) { return *raws_[stripe]; }
  // raw(stripe).Send sent it as its `raw_id`; the stream's id.
  uint64_t Sent(int stripe, uint64_t raw_id, std::vector<std::string> keys);
  void NotSent();
  absl::StatusOr<Answer> Receive();
  int outstanding() const;
  // OK while every connection can carry messages; else the first's reason.
  absl::Status status() const;
  // Finishes every connection's stream; the first failure.
  absl::Status Finish();

 private:
  struct Message {
    uint64_t id = 0;
    int stripe = 0;
    uint64_t raw_id = 0;
    std::vector<std::string> keys;
  };

  const std::vector<std::unique_ptr<RawStream>> raws_;
  mutable absl::Mutex mutex_;
  std::deque<Message> sent_ ABSL_GUARDED_BY(mutex_);  // not yet received, oldest first
  int sending_ ABSL_GUARDED_BY(mutex_) = 0;           // between Pick and Sent
  int next_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t last_id_ ABSL_GUARDED_BY(mutex_) = 0;
};

Stripes::Stripes(std::vector<std::unique_ptr<RawStream>> raws) : raws_(std::move(raws)) {}

Stripes::~Stripes() = default;

int Stripes::Pick(const std::vector<std::string>& keys) {
  absl::MutexLock lock(&mutex_);
  ++sending_;
  for (auto it = sent_.rbegin(); it != sent_.rend(); ++it) {
    for (const std::string& key : keys) {
      if (std::find(it->keys.begin(), it->keys.end(), key) != it->keys.end()) return it->stripe;
    }
  }
  const int stripe = next_;
  next_ = (next_ + 1) % static_cast<int>(raws_.size());
  return stripe;
}

uint64_t Stripes::Sent(int stripe, uint64_t raw_id, std::vector<std::string> keys) {
  absl::MutexLock lock(&mutex_);
  --sending_;
  sent_.push_back({++last_id_, stripe, raw_id, std::move(keys)});
  return last_id_;
}

void Stripes::NotSent() {
  absl::MutexLock lock(&mutex_);
  --sending_;
}

absl::StatusOr<Stripes::Answer> Stripes::Receive() {
  Message oldest;
  {
    absl::MutexLock lock(&mutex_);
    // A message being sent is outstanding already (as on one stream).
    mutex_.Await(absl::Condition(
        +[](Stripes* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mutex_) {
          return !self->sent_.empty() || self->sending_ == 0;
        },
        this));
    if (sent_.empty()) return raws_.front()->Receive().status();  // its words for "nothing out"
    oldest = std::move(sent_.front());
    sent_.pop_front();
  }
  absl::StatusOr<RawStream::Answer> answer = raws_[oldest.stripe]->Receive();
  if (!answer.ok()) return answer.status();
  return Answer{oldest.id, *std::move(answer)};
}

int Stripes::outstanding() const {
  int total = 0;
  for (const std::unique_ptr<RawStream>& raw : raws_) total += raw->outstanding();
  return total;
}

absl::Status Stripes::status() const {
  for (const std::unique_ptr<RawStream>& raw : raws_) {
    if (absl::Status status = raw->status(); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status Stripes::Finish() {
  absl::Status first;
  for (const std::unique_ptr<RawStream>& raw : raws_) first.Update(raw->Finish());
  return first;
}

}  // namespace internal

// ---- Attend.

struct AttendResult::Data {
  uint64_t request_id = 0;
  wire::TensorView out;  // no bytes when in_regions
  bool in_regions = false;
  bool fp8_output = false;
  std::optional<wire::TensorView> out_scales;  // with fp8_output, unless in_regions
  std::optional<wire::TensorView> lse;
  wire::TimingView timing;
  absl::once_flag out_once;
  std::vector<uint16_t> out_copy;
  absl::once_flag e4m3_once;
  std::vector<uint8_t> e4m3_copy;
  absl::once_flag scales_once;
  std::vector<uint8_t> scales_copy;
  absl::once_flag lse_once;
  std::vector<float> lse_copy;
};

AttendResult::AttendResult(std::unique_ptr<Data> data) : data_(std::move(data)) {}
AttendResult::AttendResult(AttendResult&&) noexcept = default;
AttendResult& AttendResult::operator=(AttendResult&&) noexcept = default;
AttendResult::~AttendResult() = default;

uint64_t AttendResult::request_id() const { return data_->request_id; }
int64_t AttendResult::num_tokens() const { return data_->out.shape[0]; }
int32_t AttendResult::num_heads() const { return static_cast<int32_t>(data_->out.shape[1]); }
absl::Span<const uint16_t> AttendResult::out() const {
  if (data_->fp8_output) return {};
  return FlatView(data_->out, data_->out_once, data_->out_copy);
}
bool AttendResult::fp8_output() const { return data_->fp8_output; }
absl::Span<const uint8_t> AttendResult::out_e4m3() const {
  if (!data_->fp8_output) return {};
  return FlatView(data_->out, data_->e4m3_once, data_->e4m3_copy);
}
absl::Span<const uint8_t> AttendResult::out_scales() const {
  if (!data_->out_scales.has_value()) return {};
  return FlatView(*data_->out_scales, data_->scales_once, data_->scales_copy);
}
absl::Span<const float> AttendResult::lse() const {
  if (!data_->lse.has_value()) return {};
  return FlatView(*data_->lse, data_->lse_once, data_->lse_copy);
}
bool AttendResult::has_lse() const { return data_->lse.has_value(); }
bool AttendResult::in_regions() const { return data_->in_regions; }
const wire::TensorView& AttendResult::out_view() const { return data_->out; }
const wire::TimingView& AttendResult::timing() const { return data_->timing; }

AttendStream::AttendStream(std::unique_ptr<internal::Stripes> stripes)
    : stripes_(std::move(stripes)) {}
AttendStream::~AttendStream() = default;

namespace {

// The sizes of one Attend message, from its segments and tensors.
struct AttendShape {
  int64_t tokens = 0;           // T
  int64_t heads = 0;            // H
  int64_t compressed_rows = 0;  // of every segment
};

// The values of a tensor given as a span or as a region reference (bytes
// over `value_bytes`), -1 when given as both; `field` names it.
absl::StatusOr<int64_t> ValuesOf(size_t span_values, const std::optional<RegionRef>& region,
                                 int64_t value_bytes, const char* field) {
  if (!region.has_value()) return static_cast<int64_t>(span_values);
  if (span_values > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttendInput.", field, ": given as a span and as ", field,
        "_region; give one of them"));
  }
  if (region->bytes < 0 || region->bytes % value_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("AttendInput.", field, "_region: ",
                                                   region->bytes, " bytes are not whole values"));
  }
  return region->bytes / value_bytes;
}

// The message's shape; INVALID_ARGUMENT naming the field that does not fit.
absl::StatusOr<AttendShape> ShapeOf(const AttendInput& input) {
  AttendShape shape;
  for (const AttendSegment& segment : input.segments) {
    shape.tokens += segment.num_tokens;
    shape.compressed_rows += segment.num_compressed_rows;
  }
  const int64_t tokens = shape.tokens;
  const int64_t q_row = tokens * kHeadDim;
  if (tokens <= 0) {
    return absl::InvalidArgumentError(
        "AttendInput.segments: no tokens (give at least one segment with num_tokens > 0)");
  }
  absl::StatusOr<int64_t> q = ValuesOf(input.q.size(), input.q_region, 2, "q");
  absl::StatusOr<int64_t> kv = ValuesOf(input.kv.size(), input.kv_region, 2, "kv");
  absl::StatusOr<int64_t> compressed =
      ValuesOf(input.compressed_kv.size(), input.compressed_kv_region, 2, "compressed_kv");
  for (const absl::StatusOr<int64_t>* values : {&q, &kv, &compressed}) {
    if (!values->ok()) return values->status();
  }
  if (*q == 0 || *q % q_row != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AttendInput.q: ", *q, " values is not [T=", tokens, ", H, 512] for any H"));
  }
  if (*kv != 0 && *kv != q_row) {
    return absl::InvalidArgumentError(absl::StrCat("AttendInput.kv: ", *kv, " values where [T=",
                                                   tokens, ", 512] = ", q_row,
                                                   " (or none) are expected"));
  }
  if (*compressed != shape.compressed_rows * kHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttendInput.compressed_kv: ", *compressed, " values where [", shape.compressed_rows,
        " (the segments' num_compressed_rows), 512] are expected"));
  }
  if (input.topk.size() % tokens != 0) {
    return absl::InvalidArgumentError(absl::StrCat("AttendInput.topk: ", input.topk.size(),
                                                   " values is not [T=", tokens, ", K] for any K"));
  }
  shape.heads = *q / q_row;
  return shape;
}

// The answer regions fit the answer: out [T, H, 512] bf16 (or e4m3fn, and
// then out_scales [T, H, 4] UE8M0) and, with return_lse, lse [T, H] f32;
// none, or out (with its scales) alone without return_lse.
absl::Status CheckAnswerRegions(const AttendInput& input, const AttendShape& shape) {
  if (!input.out_region.has_value()) {
    if (input.lse_region.has_value()) {
      return absl::InvalidArgumentError("AttendInput.lse_region: only with out_region");
    }
    if (input.out_scales_region.has_value()) {
      return absl::InvalidArgumentError("AttendInput.out_scales_region: only with out_region");
    }
    return absl::OkStatus();
  }
  const int64_t values = shape.tokens * shape.heads;
  const int64_t value_bytes = input.fp8_output ? 1 : 2;
  if (input.out_region->bytes != values * kHeadDim * value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttendInput.out_region: ", input.out_region->bytes, " bytes where out [T=", shape.tokens,
        ", H=", shape.heads, ", 512] ", input.fp8_output ? "e4m3fn" : "bf16", " needs ",
        values * kHeadDim * value_bytes));
  }
  if (input.fp8_output != input.out_scales_region.has_value()) {
    return absl::InvalidArgumentError(
        "AttendInput.out_scales_region: give one exactly when fp8_output is set (with "
        "out_region)");
  }
  if (input.fp8_output && input.out_scales_region->bytes != values * kOutputBlocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttendInput.out_scales_region: ", input.out_scales_region->bytes,
        " bytes where out_scales [T=", shape.tokens, ", H=", shape.heads, ", 4] UE8M0 needs ",
        values * kOutputBlocks));
  }
  if (input.return_lse != input.lse_region.has_value()) {
    return absl::InvalidArgumentError(
        "AttendInput.lse_region: give one exactly when return_lse is set (with out_region)");
  }
  if (input.return_lse && input.lse_region->bytes != values * 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AttendInput.lse_region: ", input.lse_region->bytes, " bytes where lse [T=",
        shape.tokens, ", H=", shape.heads, "] f32 needs ", values * 4));
  }
  return absl::OkStatus();
}

std::optional<wire::RegionRefView> RefView(const std::optional<RegionRef>& region) {
  if (!region.has_value()) return std::nullopt;
  return wire::RegionRefView{region->region_id, region->offset, region->bytes};
}

// The message of `input` with request id `id`; tensors given as spans are
// referenced with `keep_alive`.
wire::AttendRequestView RequestOf(const AttendInput& input, const AttendShape& shape, uint64_t id,
                                  const std::shared_ptr<const void>& keep_alive) {
  wire::AttendRequestView request;
  request.request_id = id;
  request.layer = input.layer;
  request.head_offset = input.head_offset;
  request.return_lse = input.return_lse;
  request.derotate_output = input.derotate_output;
  request.fp8_output = input.fp8_output;
  for (const AttendSegment& segment : input.segments) {
    request.segments.push_back({segment.session_id, segment.position, segment.num_tokens,
                                segment.first_compressed_row, segment.num_compressed_rows});
  }
  // Present when given as a span or a region; a region's bytes stay there.
  const auto tensor = [&keep_alive](wire::DType dtype, std::vector<int64_t> tensor_shape,
                                    const void* data, size_t bytes,
                                    const std::optional<RegionRef>& region) {
    wire::TensorView view =
        wire::MakeTensorView(dtype, std::move(tensor_shape), data, bytes, keep_alive);
    view.region = RefView(region);
    return view;
  };
  const int64_t t = shape.tokens;
  request.q = tensor(wire::DType::kBf16, {t, shape.heads, kHeadDim}, input.q.data(),
                     input.q.size() * 2, input.q_region);
  if (!input.kv.empty() || input.kv_region.has_value()) {
    request.kv = tensor(wire::DType::kBf16, {t, kHeadDim}, input.kv.data(), input.kv.size() * 2,
                        input.kv_region);
  }
  if (!input.compressed_kv.empty() || input.compressed_kv_region.has_value()) {
    request.compressed_kv =
        tensor(wire::DType::kBf16, {shape.compressed_rows, kHeadDim}, input.compressed_kv.data(),
               input.compressed_kv.size() * 2, input.compressed_kv_region);
  }
  if (!input.topk.empty()) {
    request.topk = tensor(wire::DType::kI32, {t, static_cast<int64_t>(input.topk.size()) / t},
                          input.topk.data(), input.topk.size() * 4, std::nullopt);
  }
  request.out_region = RefView(input.out_region);
  request.lse_region = RefView(input.lse_region);
  request.out_scales_region = RefView(input.out_scales_region);
  return request;
}

}  // namespace

absl::StatusOr<uint64_t> AttendStream::Send(const AttendInput& input) {
  absl::StatusOr<AttendShape> shape = ShapeOf(input);
  if (!shape.ok()) return shape.status();
  if (absl::Status status = CheckAnswerRegions(input, *shape); !status.ok()) return status;
  std::vector<std::string> keys;  // the session layers of the message
  keys.reserve(input.segments.size());
  for (const AttendSegment& segment : input.segments) {
    keys.push_back(absl::StrCat(input.layer, "/", segment.session_id));
  }
  const int stripe = stripes_->Pick(keys);
  internal::RawStream& raw = stripes_->raw(stripe);
  const std::shared_ptr<const void> keep_alive = raw.Guard(input.keep_alive);
  absl::StatusOr<uint64_t> sent = raw.Send(
      [&](uint64_t id) -> absl::StatusOr<grpc::ByteBuffer> {
        return wire::SerializeAttendRequest(RequestOf(input, *shape, id, keep_alive));
      },
      internal::ExpectedAnswer{{shape->tokens, shape->heads, kHeadDim},
                               input.out_region.has_value(),
                               input.fp8_output});
  if (!sent.ok()) {
    stripes_->NotSent();
    return sent.status();
  }
  return stripes_->Sent(stripe, *sent, std::move(keys));
}

absl::StatusOr<AttendResult> AttendStream::Receive() {
  absl::StatusOr<internal::Stripes::Answer> received = stripes_->Receive();
  if (!received.ok()) return received.status();
  internal::RawStream::Answer* answer = &received->raw;
  absl::StatusOr<wire::AttendResponseView> response =
      wire::ParseAttendResponse(answer->buffer, std::numeric_limits<size_t>::max());
  const std::string what = absl::StrCat("Attend request ", received->id);
  if (!response.ok()) {
    return absl::InternalError(
        absl::StrCat(what, ": the answer does not parse: ", response.status().message()));
  }
  if (response->status.has_value() && response->status->code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(response->status->code),
                        absl::StrCat(what, ": ", response->status->message));
  }
  if (response->request_id != answer->id) {
    return absl::InternalError(absl::StrCat(what, ": answered with request_id ",
                                            response->request_id, " (answers out of order)"));
  }
  const internal::ExpectedAnswer& expected = answer->expected;
  const std::vector<int64_t>& shape = expected.shape;  // [T, H, 512]
  const wire::DType out_dtype = expected.fp8_output ? wire::DType::kE4m3fn : wire::DType::kBf16;
  if (expected.in_regions) {
    if (response->out.has_value() || response->lse.has_value() ||
        response->out_scales.has_value()) {
      return absl::InternalError(
          absl::StrCat(what, ": an answer written into out_region that also carries tensors"));
    }
    auto data = std::make_unique<AttendResult::Data>();
    data->request_id = received->id;
    data->out.dtype = out_dtype;
    data->out.shape = shape;
    data->in_regions = true;
    data->fp8_output = expected.fp8_output;
    if (response->timing.has_value()) data->timing = *response->timing;
    return AttendResult(std::move(data));
  }
  if (!response->out.has_value()) {
    return absl::InternalError(absl::StrCat(what, ": an OK answer without out"));
  }
  // An answer not shaped like the message sent is a server fault, not
  // something to hand on.
  auto check = [&what](const wire::TensorView& tensor, const char* name, wire::DType dtype,
                       const std::vector<int64_t>& shape) -> absl::Status {
    absl::Status status = wire::CheckTensor(tensor, name, dtype, shape);
    if (status.ok()) return status;
    const auto dtype_name = [](wire::DType value) {
      return mla_offload::v1::DType_Name(static_cast<mla_offload::v1::DType>(value));
    };
    // The checker's words only when dtype and shape are right and the bytes
    // are not; the rest says it already.
    const bool bytes_wrong = tensor.dtype == dtype && tensor.shape == shape;
    return absl::InternalError(absl::StrCat(
        what, ": ", name, " is [", absl::StrJoin(tensor.shape, ", "), "] ",
        dtype_name(tensor.dtype), " where [", absl::StrJoin(shape, ", "), "] ", dtype_name(dtype),
        " is expected", bytes_wrong ? ": " : "", bytes_wrong ? status.message() : ""));
  };
  if (absl::Status status = check(*response->out, "AttendResponse.out", out_dtype, shape);
      !status.ok()) {
    return status;
  }
  if (expected.fp8_output != response->out_scales.has_value()) {
    return absl::InternalError(absl::StrCat(
        what, expected.fp8_output ? ": an FP8 answer without out_scales"
                                  : ": a bf16 answer with out_scales"));
  }
  if (expected.fp8_output) {
    if (absl::Status status = check(*response->out_scales, "AttendResponse.out_scales",
                                    wire::DType::kUe8m0, {shape[0], shape[1], kOutputBlocks});
        !status.ok()) {
      return status;
    }
  }
  if (response->lse.has_value()) {
    if (absl::Status status =
            check(*response->lse, "AttendResponse.lse", wire::DType::kF32, {shape[0], shape[1]});
        !status.ok()) {
      return status;
    }
  }
  auto data = std::make_unique<AttendResult::Data>();
  data->request_id = received->id;
  data->out = *std::move(response->out);
  data->fp8_output = expected.fp8_output;
  data->out_scales = std::move(response->out_scales);
  data->lse = std::move(response->lse);
  if (response->timing.has_value()) data->timing = *response->timing;
  return AttendResult(std::move(data));
}

int AttendStream::outstanding() const { return stripes_->outstanding(); }
absl::Status AttendStream::status() const { return stripes_->status(); }
absl::Status AttendStream::Finish() { return stripes_->Finish(); }

// ---- Echo.

struct EchoResult::Data {
  std::vector<grpc::Slice> slices;
  std::vector<wire::Piece> pieces;
  size_t size = 0;
};

EchoResult::EchoResult(std::unique_ptr<Data> data) : data_(std::move(data)) {}
EchoResult::EchoResult(EchoResult&&) noexcept = default;
EchoResult& EchoResult::operator=(EchoResult&&) noexcept = default;
EchoResult::~EchoResult() = default;

size_t EchoResult::size() const { return data_->size; }
const std::vector<wire::Piece>& EchoResult::pieces() const { return data_->pieces; }
void EchoResult::CopyTo(void* dst) const {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (const wire::Piece& piece : data_->pieces) {
    std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
}
std::string EchoResult::ToString() const {
  std::string bytes(data_->size, '\0');
  CopyTo(bytes.data());
  return bytes;
}

EchoStream::EchoStream(std::unique_ptr<internal::Stripes> stripes)
    : stripes_(std::move(stripes)) {}
EchoStream::~EchoStream() = default;

absl::StatusOr<uint64_t> EchoStream::Send(absl::Span<const uint8_t> payload,
                                          std::shared_ptr<const void> keep_alive) {
  const int stripe = stripes_->Pick({});
  internal::RawStream& raw = stripes_->raw(stripe);
  const std::shared_ptr<const void> guard = raw.Guard(std::move(keep_alive));
  absl::StatusOr<uint64_t> sent = raw.Send([&](uint64_t) -> absl::StatusOr<grpc::ByteBuffer> {
    wire::WireWriter writer;
    const wire::Piece piece(payload.data(), payload.size());
    writer.WriteBytes(mla_offload::v1::EchoMessage::kPayloadFieldNumber,
                      absl::MakeConstSpan(&piece, 1), guard);
    return writer.Finish();
  });
  if (!sent.ok()) {
    stripes_->NotSent();
    return sent.status();
  }
  return stripes_->Sent(stripe, *sent, {});
}

absl::StatusOr<EchoResult> EchoStream::Receive() {
  absl::StatusOr<internal::Stripes::Answer> received = stripes_->Receive();
  if (!received.ok()) return received.status();
  const internal::RawStream::Answer* answer = &received->raw;
  auto data = std::make_unique<EchoResult::Data>();
  if (grpc::Status status = answer->buffer.Dump(&data->slices); !status.ok()) {
    return StatusFromGrpc(status, absl::StrCat("Echo message ", received->id));
  }
  const std::vector<wire::Piece> all = PiecesOf(data->slices);
  wire::WireReader reader(all);
  while (!reader.AtLimit()) {
    wire::Tag tag;
    absl::Status status = reader.ReadTag(&tag);
    if (status.ok()) {
      if (tag.field == mla_offload::v1::EchoMessage::kPayloadFieldNumber &&
          tag.type == wire::WireType::kLengthDelimited) {
        size_t length = 0;
        status = reader.ReadLength(&length);
        if (status.ok()) {
          data->pieces.clear();
          reader.TakePieces(length, &data->pieces);
          data->size = length;
        }
      } else {
        status = reader.SkipField(tag);
      }
    }
    if (!status.ok()) {
      return absl::InternalError(
          absl::StrCat("Echo message ", received->id, ": the answer does not parse: ",
                       status.message()));
    }
  }
  return EchoResult(std::move(data));
}

int EchoStream::outstanding() const { return stripes_->outstanding(); }
absl::Status EchoStream::status() const { return stripes_->status(); }
absl::Status EchoStream::Finish() { return stripes_->Finish(); }

// ---- Client.

namespace {

// A channel to `target` with `options`' transport and credentials; its own
// TCP connection when `own_connection` (gRPC shares one between channels of
// equal arguments otherwise).
absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const std::string& target,
                                                          const ConnectOptions& options,
                                                          bool own_connection) {
  grpc::ChannelArguments args;
  const int max_bytes =
      static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX));
  args.SetMaxReceiveMessageSize(max_bytes);
  args.SetMaxSendMessageSize(max_bytes);
  // The server's settings: large tensor messages must not stall on flow
  // control every 64 KiB.
  DefaultTransport().Apply([&args](const char* name, int value) { args.SetInt(name, value); });
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.use_tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs_pem;
    ssl.pem_cert_chain = options.tls_client_cert_pem;
    ssl.pem_private_key = options.tls_client_key_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  if (credentials == nullptr) {
    return absl::InvalidArgumentError("ConnectOptions: gRPC refused the TLS credentials");
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        const ConnectOptions& options) {
  if (target.empty()) {
    return absl::InvalidArgumentError("no target: give the server as HOST:PORT");
  }
  if (options.tls_client_cert_pem.empty() != options.tls_client_key_pem.empty()) {
    return absl::InvalidArgumentError(
        "ConnectOptions: mutual TLS needs both tls_client_cert_pem and tls_client_key_pem");
  }
  if (!options.use_tls &&
      (!options.tls_root_certs_pem.empty() || !options.tls_client_cert_pem.empty())) {
    return absl::InvalidArgumentError(
        "ConnectOptions: TLS certificates given but use_tls is false (set use_tls)");
  }
  for (char c : options.bearer_token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          "ConnectOptions.bearer_token: a token is printable ASCII without spaces (is there a "
          "newline at the end of the token file?)");
    }
  }
  if (!options.bearer_token.empty() && !options.use_tls && !wire::IsLoopbackAddress(target)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ConnectOptions: a bearer token over plaintext to ", target,
        ", which is not on this host, would cross the network in the clear; set use_tls"));
  }
  if (!options.use_tls && !options.tls_server_name.empty()) {
    return absl::InvalidArgumentError(
        "ConnectOptions: tls_server_name given but use_tls is false (set use_tls)");
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("ConnectOptions.max_message_bytes must be positive");
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      NewChannel(target, options, options.own_connection);
  if (!channel.ok()) return channel.status();
  if (options.connect_timeout > absl::ZeroDuration() &&
      !(*channel)->WaitForConnected(DeadlineAfter(options.connect_timeout))) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", target, " within ",
                     absl::FormatDuration(options.connect_timeout),
                     " (is the server running there, and plaintext/TLS as configured?)"));
  }
  return std::unique_ptr<Client>(new Client(target, *std::move(channel), options));
}

Client::Client(std::string target, std::shared_ptr<grpc::Channel> channel,
               const ConnectOptions& options)
    : target_(std::move(target)),
      channel_(std::move(channel)),
      options_(options),
      client_id_(NewClientId()) {
  metadata_.emplace_back(wire::kClientIdMetadata, client_id_);
  if (!options.bearer_token.empty()) {
    metadata_.emplace_back("authorization", absl::StrCat("Bearer ", options.bearer_token));
  }
}

Client::~Client() = default;

void Client::Prepare(grpc::ClientContext& context, const CallOptions& call) const {
  const absl::Duration timeout =
      call.timeout > absl::ZeroDuration() ? call.timeout : options_.call_timeout;
  if (timeout != absl::InfiniteDuration()) context.set_deadline(DeadlineAfter(timeout));
  for (const auto& [key, value] : metadata_) context.AddMetadata(key, value);
}

template <typename Request, typename Response>
absl::Status Client::Unary(absl::string_view method, const Request& request, Response* response,
                           const CallOptions& call) {
  grpc::ClientContext context;
  Prepare(context, call);
  const std::string name = absl::StrCat("/mla_offload.v1.MlaOffload/", method);
  const grpc::internal::RpcMethod rpc(name.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Status status =
      grpc::internal::BlockingUnaryCall<Request, Response>(channel_.get(), rpc, &context, request,
                                                           response);
  return StatusFromGrpc(status, absl::StrCat(method, " on ", target_));
}

absl::StatusOr<std::vector<grpc::Slice>> Client::UnaryRaw(const char* method,
                                                          const grpc::ByteBuffer& request,
                                                          const CallOptions& call,
                                                          absl::string_view what) {
  grpc::ClientContext context;
  Prepare(context, call);
  const grpc::internal::RpcMethod rpc(method, grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ByteBuffer answer;
  grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel_.get(), rpc, &context, request, &answer);
  if (!status.ok()) return StatusFromGrpc(status, what);
  std::vector<grpc::Slice> slices;
  if (answer.Valid() && !answer.Dump(&slices).ok()) {
    return absl::InternalError(absl::StrCat(what, ": unreadable answer"));
  }
  return slices;
}

absl::StatusOr<pb::ServerInfo> Client::GetServerInfo(const CallOptions& call) {
  pb::ServerInfo info;
  if (absl::Status status = Unary("GetServerInfo", pb::GetServerInfoRequest(), &info, call);
      !status.ok()) {
    return status;
  }
  return info;
}

absl::StatusOr<HealthStatus> Client::CheckHealth(const std::string& service,
                                                 const CallOptions& call) {
  // grpc.health.v1.HealthCheckRequest {string service = 1}; the response
  // {ServingStatus status = 1}. Written by hand so that this library links
  // no second copy of the health proto's descriptors.
  wire::WireWriter writer;
  writer.WriteString(1, service);
  const std::string what = absl::StrCat("Health.Check on ", target_);
  absl::StatusOr<std::vector<grpc::Slice>> answer =
      UnaryRaw(kHealthCheckMethod, writer.Finish(), call, what);
  if (!answer.ok()) return answer.status();
  const std::vector<wire::Piece> pieces = PiecesOf(*answer);
  wire::WireReader reader(pieces);
  uint64_t value = 0;
  while (!reader.AtLimit()) {
    wire::Tag tag;
    absl::Status parsed = reader.ReadTag(&tag);
    if (parsed.ok()) {
      parsed = tag.field == 1 && tag.type == wire::WireType::kVarint ? reader.ReadVarint(&value)
                                                                    : reader.SkipField(tag);
    }
    if (!parsed.ok()) {
      return absl::InternalError(absl::StrCat(what, ": the answer does not parse: ",
                                              parsed.message()));
    }
  }
  switch (value) {
    case 1:
      return HealthStatus::kServing;
    case 2:
      return HealthStatus::kNotServing;
    case 3:
      return HealthStatus::kServiceUnknown;
    default:
      return HealthStatus::kUnknown;
  }
}

absl::StatusOr<pb::CreateSessionResponse> Client::CreateSession(const SessionOptions& options,
                                                                const CallOptions& call) {
  pb::CreateSessionRequest request;
  request.set_model(options.model);
  request.set_num_heads(options.num_heads);
  if (options.idle_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SessionOptions.idle_ttl is ", absl::FormatDuration(options.idle_ttl),
                     ": give zero (the server's default) or a positive duration"));
  }
  // Whole seconds, rounded up; longer than the wire's int32 (68 years, or
  // InfiniteDuration) becomes the longest the server can be asked for.
  const absl::Duration longest = absl::Seconds(std::numeric_limits<int32_t>::max());
  request.set_idle_ttl_seconds(static_cast<int32_t>(absl::ToInt64Seconds(
      absl::Ceil(std::min(options.idle_ttl, longest), absl::Seconds(1)))));
  if (!options.sinks.empty()) {
    // Divided, not multiplied: no product of the caller's numbers overflows.
    const int64_t values = static_cast<int64_t>(options.sinks.size());
    if (options.sinks_shape.size() != 2 || options.sinks_shape[0] < 1 ||
        options.sinks_shape[1] < 1 || values % options.sinks_shape[0] != 0 ||
        values / options.sinks_shape[0] != options.sinks_shape[1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SessionOptions.sinks_shape must be [num_attention_layers, heads] with ",
          options.sinks.size(), " values in all (the size of sinks)"));
    }
    pb::Tensor* sinks = request.mutable_sinks();
    sinks->set_dtype(pb::DTYPE_F32);
    for (int64_t dim : options.sinks_shape) sinks->add_shape(dim);
    sinks->set_data(options.sinks.data(), options.sinks.size() * sizeof(float));
  }
  pb::CreateSessionResponse response;
  if (absl::Status status = Unary("CreateSession", request, &response, call); !status.ok()) {
    return status;
  }
  return response;
}

namespace {

// An AppendKVRequest whose rows are slices referencing the caller's memory,
// each holding `guard`.
absl::StatusOr<grpc::ByteBuffer> AppendKVRequestBytes(const std::string& session_id,
                                                      int32_t first_position,
                                                      int32_t num_positions,
                                                      absl::Span<const LayerRowsInput> layers,
                                                      const std::shared_ptr<const void>& guard) {
  using pb::AppendKVRequest;
  using pb::LayerRows;
  using pb::Tensor;
  wire::WireWriter writer;
  writer.WriteString(AppendKVRequest::kSessionIdFieldNumber, session_id);
  writer.WriteVarint(AppendKVRequest::kFirstPositionFieldNumber,
                     static_cast<uint64_t>(static_cast<int64_t>(first_position)));
  writer.WriteVarint(AppendKVRequest::kNumPositionsFieldNumber,
                     static_cast<uint64_t>(static_cast<int64_t>(num_positions)));
  for (const LayerRowsInput& layer : layers) {
    if (layer.swa_kv.size() % kHeadDim != 0 || layer.compressed_kv.size() % kHeadDim != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AppendKV layer ", layer.layer, ": swa_kv has ", layer.swa_kv.size(),
          " values and compressed_kv ", layer.compressed_kv.size(),
          "; each must be whole rows of 512"));
    }
    auto tensor = [&guard](absl::Span<const uint16_t> rows) {
      wire::WireWriter t;
      t.WriteVarint(Tensor::kDtypeFieldNumber, pb::DTYPE_BF16);
      const int64_t shape[2] = {static_cast<int64_t>(rows.size()) / kHeadDim, kHeadDim};
      t.WritePackedInt64(Tensor::kShapeFieldNumber, shape);
      const wire::Piece piece(reinterpret_cast<const uint8_t*>(rows.data()), rows.size() * 2);
      t.WriteBytes(Tensor::kDataFieldNumber, absl::MakeConstSpan(&piece, 1), guard);
      return t;
    };
    wire::WireWriter rows;
    rows.WriteVarint(LayerRows::kLayerFieldNumber,
                     static_cast<uint64_t>(static_cast<int64_t>(layer.layer)));
    rows.WriteMessage(LayerRows::kSwaKvFieldNumber, tensor(layer.swa_kv));
    if (!layer.compressed_kv.empty()) {
      rows.WriteMessage(LayerRows::kCompressedKvFieldNumber, tensor(layer.compressed_kv));
    }
    rows.WriteVarint(LayerRows::kFirstCompressedRowFieldNumber,
                     static_cast<uint64_t>(static_cast<int64_t>(layer.first_compressed_row)));
    writer.WriteMessage(AppendKVRequest::kLayersFieldNumber, std::move(rows));
  }
  return writer.Finish();
}

}  // namespace

absl::StatusOr<pb::AppendKVResponse> Client::AppendKV(const std::string& session_id,
                                                      int32_t first_position,
                                                      int32_t num_positions,
                                                      absl::Span<const LayerRowsInput> layers,
                                                      const CallOptions& call) {
  // The request written field by field so that the rows are referenced, not
  // copied (the generated class would copy each into a string). The rows
  // are the caller's until this returns: wait for gRPC to release them.
  ReleaseCounter released;
  absl::StatusOr<std::vector<grpc::Slice>> answer;
  const std::string what = absl::StrCat("AppendKV on ", target_);
  {
    std::shared_ptr<const void> guard = released.Guard(nullptr);
    absl::StatusOr<grpc::ByteBuffer> request = AppendKVRequestBytes(
        session_id, first_position, num_positions, layers, guard);
    guard.reset();
    if (!request.ok()) return request.status();
    answer = UnaryRaw(kAppendKVMethod, *request, call, what);
  }
  released.WaitUntilReleased();
  if (!answer.ok()) return answer.status();
  std::string bytes;
  for (const grpc::Slice& slice : *answer) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  pb::AppendKVResponse response;
  if (!response.ParseFromString(bytes)) {
    return absl::InternalError(absl::StrCat(what, ": the answer does not parse"));
  }
  return response;
}

absl::StatusOr<int64_t> Client::CloseSession(const std::string& session_id,
                                             const CallOptions& call) {
  pb::CloseSessionRequest request;
  request.set_session_id(session_id);
  pb::CloseSessionResponse response;
  if (absl::Status status = Unary("CloseSession", request, &response, call); !status.ok()) {
    return status;
  }
  return response.kv_blocks_freed();
}

absl::StatusOr<std::vector<pb::SessionInfo>> Client::ListSessions(const CallOptions& call) {
  pb::ListSessionsResponse response;
  if (absl::Status status = Unary("ListSessions", pb::ListSessionsRequest(), &response, call);
      !status.ok()) {
    return status;
  }
  return std::vector<pb::SessionInfo>(response.sessions().begin(), response.sessions().end());
}

absl::StatusOr<uint64_t> Client::RegisterRegion(const std::string& name, int64_t bytes,
                                                const CallOptions& call) {
  pb::RegisterRegionRequest request;
  request.set_kind(pb::REGION_KIND_SYSTEM_SHM);
  request.set_name(name);
  request.set_byte_size(bytes);
  pb::RegisterRegionResponse response;
  if (absl::Status status = Unary("RegisterRegion", request, &response, call); !status.ok()) {
    return status;
  }
  return response.region_id();
}

absl::StatusOr<uint64_t> Client::RegisterCudaRegion(const std::string& cuda_ipc_handle,
                                                    const std::string& device_uuid,
                                                    int64_t bytes, const CallOptions& call) {
  pb::RegisterRegionRequest request;
  request.set_kind(pb::REGION_KIND_CUDA_IPC);
  request.set_cuda_ipc_handle(cuda_ipc_handle);
  request.set_device_uuid(device_uuid);
  request.set_byte_size(bytes);
  pb::RegisterRegionResponse response;
  if (absl::Status status = Unary("RegisterRegion", request, &response, call); !status.ok()) {
    return status;
  }
  return response.region_id();
}

absl::StatusOr<RegionRef> RegionRef::Within(uint64_t region_id, int64_t region_bytes,
                                            int64_t offset, int64_t bytes,
                                            absl::string_view region) {
  // offset + bytes <= region_bytes with both non-negative: no sum formed.
  if (offset < 0 || bytes < 0 || offset > region_bytes || bytes > region_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat(region, ": bytes [", offset, ", ", offset,
                                                   " + ", bytes, ") do not lie within its ",
                                                   region_bytes, " bytes"));
  }
  return RegionRef{region_id, offset, bytes};
}

absl::Status Client::UnregisterRegion(uint64_t region_id, const CallOptions& call) {
  pb::UnregisterRegionRequest request;
  request.set_region_id(region_id);
  pb::UnregisterRegionResponse response;
  return Unary("UnregisterRegion", request, &response, call);
}

absl::StatusOr<std::vector<pb::RegionInfo>> Client::ListRegions(const CallOptions& call) {
  pb::ListRegionsResponse response;
  if (absl::Status status = Unary("ListRegions", pb::ListRegionsRequest(), &response, call);
      !status.ok()) {
    return status;
  }
  return std::vector<pb::RegionInfo>(response.regions().begin(), response.regions().end());
}

absl::StatusOr<std::unique_ptr<internal::Stripes>> Client::OpenStripes(
    absl::string_view method, const StreamOptions& options) {
  if (options.step_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("StreamOptions.step_timeout must be positive");
  }
  if (options.connections < 1 || options.connections > kMaxStreamConnections) {
    return absl::InvalidArgumentError(absl::StrCat("StreamOptions.connections is ",
                                                   options.connections, "; give 1 to ",
                                                   kMaxStreamConnections));
  }
  const std::string name(method);
  std::vector<std::unique_ptr<internal::RawStream>> raws;
  for (int c = 0; c < options.connections; ++c) {
    // The first on the client's channel, the others on connections of their own.
    std::shared_ptr<grpc::Channel> channel = channel_;
    if (c > 0) {
      absl::StatusOr<std::shared_ptr<grpc::Channel>> own =
          NewChannel(target_, options_, /*own_connection=*/true);
      if (!own.ok()) return own.status();
      channel = *std::move(own);
    }
    auto raw = std::make_unique<internal::RawStream>(
        absl::StrCat(name.substr(name.rfind('/') + 1), " stream on ", target_,
                     options.connections > 1 ? absl::StrCat(" (connection ", c + 1, ")") : ""),
        options);
    raw->Start(channel, name, metadata_);
    raws.push_back(std::move(raw));
  }
  return std::make_unique<internal::Stripes>(std::move(raws));
}

absl::StatusOr<std::unique_ptr<AttendStream>> Client::OpenAttendStream(
    const StreamOptions& options) {
  absl::StatusOr<std::unique_ptr<internal::Stripes>> stripes = OpenStripes(kAttendMethod, options);
  if (!stripes.ok()) return stripes.status();
  return std::unique_ptr<AttendStream>(new AttendStream(*std::move(stripes)));
}

absl::StatusOr<std::unique_ptr<EchoStream>> Client::OpenEchoStream(const StreamOptions& options) {
  absl::StatusOr<std::unique_ptr<internal::Stripes>> stripes = OpenStripes(kEchoMethod, options);
  if (!stripes.ok()) return stripes.status();
  return std::unique_ptr<EchoStream>(new EchoStream(*std::move(stripes)));
}

// ---- Placement.

uint64_t RendezvousWeight(absl::string_view session_key, absl::string_view target) {
  return SplitMix64(Fnv1a64(session_key) ^ SplitMix64(Fnv1a64(target)));
}

int RendezvousPlace(absl::string_view session_key, absl::Span<const std::string> targets) {
  int best = -1;
  uint64_t best_weight = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const uint64_t weight = RendezvousWeight(session_key, targets[i]);
    if (best < 0 || weight > best_weight ||
        (weight == best_weight && targets[i] < targets[best])) {
      best = static_cast<int>(i);
      best_weight = weight;
    }
  }
  return best;
}

absl::StatusOr<std::vector<std::string>> StatefulSetTargets(const StatefulSetPods& pods) {
  if (pods.name.empty()) {
    return absl::InvalidArgumentError("StatefulSetPods.name is empty: give the StatefulSet's name");
  }
  if (pods.replicas < 1 || pods.replicas > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("StatefulSetPods.replicas is ", pods.replicas, ": give 1 to 100000"));
  }
  if (pods.port < 1 || pods.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("StatefulSetPods.port is ", pods.port, ": give 1 to 65535"));
  }
  if (!pods.cluster_domain.empty() && pods.name_space.empty()) {
    return absl::InvalidArgumentError("StatefulSetPods.cluster_domain needs name_space");
  }
  std::string host = pods.service.empty() ? absl::StrCat(pods.name, "-headless") : pods.service;
  if (!pods.name_space.empty()) absl::StrAppend(&host, ".", pods.name_space, ".svc");
  if (!pods.cluster_domain.empty()) absl::StrAppend(&host, ".", pods.cluster_domain);
  std::vector<std::string> targets;
  for (int ordinal = 0; ordinal < pods.replicas; ++ordinal) {
    targets.push_back(absl::StrCat(pods.name, "-", ordinal, ".", host, ":", pods.port));
  }
  return targets;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Connect(std::vector<std::string> targets,
                                                          const ConnectOptions& options) {
  if (targets.empty()) {
    return absl::InvalidArgumentError("Cluster: no targets (give at least one HOST:PORT)");
  }
  std::vector<std::string> sorted = targets;
  std::sort(sorted.begin(), sorted.end());
  if (auto repeat = std::adjacent_find(sorted.begin(), sorted.end()); repeat != sorted.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Cluster: target ", *repeat, " is listed twice"));
  }
  std::vector<std::unique_ptr<Client>> clients;
  for (const std::string& target : targets) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target, options);
    if (!client.ok()) return client.status();
    clients.push_back(*std::move(client));
  }
  return std::unique_ptr<Cluster>(new Cluster(std::move(targets), std::move(clients)));
}

Cluster::Cluster(std::vector<std::string> targets, std::vector<std::unique_ptr<Client>> clients)
    : targets_(std::move(targets)), clients_(std::move(clients)), alive_(targets_.size(), true) {}

bool IsSameHostTarget(absl::string_view target) { return wire::IsLoopbackAddress(target); }

absl::StatusOr<int> Cluster::Place(absl::string_view session_key, const PlaceOptions& where) const {
  std::vector<std::string> live;
  std::vector<int> index;
  int lost = 0;
  {
    absl::MutexLock lock(&mutex_);
    for (size_t i = 0; i < targets_.size(); ++i) {
      if (where.same_host && !IsSameHostTarget(targets_[i])) continue;
      if (!alive_[i]) {
        ++lost;
        continue;
      }
      live.push_back(targets_[i]);
      index.push_back(static_cast<int>(i));
    }
  }
  const int chosen = RendezvousPlace(session_key, live);
  if (chosen >= 0) return index[chosen];
  if (where.same_host && lost == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no server of this cluster is on this host, and session key '", session_key,
        "' asks for one (its tensors go through shared memory): connect to a local server "
        "through a unix: or loopback target"));
  }
  return absl::UnavailableError(absl::StrCat(
      "no live server for session key '", session_key, "': all ", lost,
      where.same_host ? " of this host" : "", " are marked lost (MarkAlive one that is back)"));
}

absl::StatusOr<PlacedSession> Cluster::CreateSession(absl::string_view session_key,
                                                     const SessionOptions& options,
                                                     const CallOptions& call,
                                                     const PlaceOptions& where) {
  absl::StatusOr<int> server = Place(session_key, where);
  if (!server.ok()) return server.status();
  absl::StatusOr<pb::CreateSessionResponse> session =
      clients_[*server]->CreateSession(options, call);
  if (!session.ok()) return session.status();
  PlacedSession placed;
  placed.server = *server;
  placed.target = targets_[*server];
  placed.session = *std::move(session);
  return placed;
}

void Cluster::MarkLost(int server) {
  absl::MutexLock lock(&mutex_);
  alive_.at(server) = false;
}

void Cluster::MarkAlive(int server) {
  absl::MutexLock lock(&mutex_);
  alive_.at(server) = true;
}

bool Cluster::alive(int server) const {
  absl::MutexLock lock(&mutex_);
  return alive_.at(server);
}

}  // namespace mla::client
