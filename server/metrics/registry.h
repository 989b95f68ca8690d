// A registry of the server's metrics, rendered in the Prometheus text
// exposition format, version 0.0.4.
//
// A metric family has a name, help text and fixed label names, and holds one
// child per tuple of label values. Kinds: CounterFamily (monotonic counters),
// GaugeFamily (values that are set or added to), CallbackGaugeFamily (values
// read from a callback at scrape time, e.g. KV blocks free in a pool) and
// HistogramFamily (bucketed observations with fixed bounds).
//
// Ownership: the Registry owns its families and each family owns its children.
// Families and children are never removed, so every pointer the registry hands
// out stays valid as long as the Registry lives.
//
// Thread safety: everything may be called from any thread. Updating a child
// (Counter::Increment, Gauge::Set, Histogram::Observe, ...) is lock-free: a
// few relaxed atomic operations. Looking a child up by label values takes the
// family's lock and copies the values, so a hot path looks its children up
// once and keeps the pointers. Rendering reads the atomics without stopping
// writers: a scrape that races with Observe may see a histogram's _sum include
// an observation its buckets do not yet count, as Prometheus clients allow.
//
// Errors: registration and lookup return absl::Status values:
// INVALID_ARGUMENT for a name, label name, bucket list or number of label
// values that Prometheus would not accept; ALREADY_EXISTS when a name is
// registered again with another kind, help text, label names or buckets.
// Registering the same definition again returns the existing family. Updates
// cannot fail.
#ifndef MLA_OFFLOAD_SERVER_METRICS_REGISTRY_H_
#define MLA_OFFLOAD_SERVER_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace mla::metrics {

// The Content-Type of Registry::RenderText's output.
inline constexpr char kTextContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";

// A monotonic counter. Integer increments are kept exactly in a uint64;
// fractional ones (e.g. seconds of busy time) in a separate double.
class Counter {
 public:
  void Increment(uint64_t n = 1) {
    whole_.fetch_add(n, std::memory_order_relaxed);
  }
  // A counter never decreases: negative and NaN increments are ignored.
  void Add(double v);

  double Value() const;

 private:
  friend class CounterFamily;
  std::atomic<uint64_t> whole_{0};
  std::atomic<double> fraction_{0.0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into buckets with fixed upper bounds (Prometheus' "le":
// a value v falls into the first bucket whose bound is >= v; NaN and values
// above the last bound only into the implicit +Inf bucket) and sums them.
class Histogram {
 public:
  // `bounds` (strictly increasing, finite) must outlive the histogram; a
  // HistogramFamily passes its own.
  explicit Histogram(absl::Span<const double> bounds);

  void Observe(double v);

  struct Snapshot {
    // Cumulative: one entry per bound, then the +Inf bucket, which is the
    // number of observations.
    std::vector<uint64_t> cumulative_counts;
    double sum = 0;
  };
  Snapshot Read() const;

 private:
  absl::Span<const double> bounds_;
  // Per bucket, not cumulative, so that Observe touches one counter. Zeroed
  // by value-initialisation; never resized.
  std::vector<std::atomic<uint64_t>> counts_;
  std::atomic<double> sum_{0.0};
};

// One family's definition; two registrations of a name must agree on all of
// it.
struct FamilyDefinition {
  enum class Kind { kCounter, kGauge, kCallbackGauge, kHistogram };

  Kind kind;
  std::string name;
  std::string help;
  std::vector<std::string> label_names;
  std::vector<double> bounds;  // histograms only

  bool operator==(const FamilyDefinition& other) const;
};

namespace internal {

// What the registry needs of every family.
class FamilyBase {
 public:
  explicit FamilyBase(FamilyDefinition definition)
      : definition_(std::move(definition)) {}
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const FamilyDefinition& definition() const { return definition_; }

  // Appends the family's # HELP and # TYPE lines and one sample line per
  // child (several per histogram child), children ordered by label values.
  virtual void AppendText(std::string* out) const = 0;

 protected:
  // INVALID_ARGUMENT unless there is one value per label name.
  absl::Status CheckLabelCount(absl::Span<const std::string> values) const;

  mutable absl::Mutex mu_;

 private:
  const FamilyDefinition definition_;
};

// A family whose children are objects updated in place.
template <typename Child>
class Family : public FamilyBase {
 public:
  using FamilyBase::FamilyBase;

  // The child for these label values (one per label name, in order), created
  // on first use. Callers on hot paths keep the pointer.
  absl::StatusOr<Child*> WithLabels(absl::Span<const std::string> label_values)
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (absl::Status s = CheckLabelCount(label_values); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Child>& child = children_[std::vector<std::string>(
        label_values.begin(), label_values.end())];
    if (child == nullptr) child = NewChild();
    return child.get();
  }

 protected:
  virtual std::unique_ptr<Child> NewChild() const = 0;

  // Sorted by label values, which makes the rendering deterministic.
  std::map<std::vector<std::string>, std::unique_ptr<Child>> children_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

class CounterFamily final : public internal::Family<Counter> {
 public:
  using Family::Family;
  void AppendText(std::string* out) const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::unique_ptr<Counter> NewChild() const override;
};

class GaugeFamily final : public internal::Family<Gauge> {
 public:
  using Family::Family;
  void AppendText(std::string* out) const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::unique_ptr<Gauge> NewChild() const override;
};

class HistogramFamily final : public internal::Family<Histogram> {
 public:
  using Family::Family;
  void AppendText(std::string* out) const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::unique_ptr<Histogram> NewChild() const override;
};

class CallbackGaugeFamily;

// Keeps a gauge callback registered; destroying (or assigning over) it
// unregisters the callback, after which it is never called again. Must not
// outlive the Registry. Move-only; a default-constructed one holds nothing.
class GaugeCallbackRegistration {
 public:
  GaugeCallbackRegistration() = default;
  ~GaugeCallbackRegistration();
  GaugeCallbackRegistration(GaugeCallbackRegistration&& other) noexcept;
  GaugeCallbackRegistration& operator=(
      GaugeCallbackRegistration&& other) noexcept;

 private:
  friend class CallbackGaugeFamily;
  GaugeCallbackRegistration(CallbackGaugeFamily* family,
                            std::vector<std::string> label_values)
      : family_(family), label_values_(std::move(label_values)) {}
  void Reset();

  CallbackGaugeFamily* family_ = nullptr;
  std::vector<std::string> label_values_;
};

// Gauges whose values are read at scrape time, for values that already live
// elsewhere (blocks used and free in a KV pool) and would otherwise have to be
// copied into a Gauge on every change.
class CallbackGaugeFamily final : public internal::FamilyBase {
 public:
  using FamilyBase::FamilyBase;

  // Makes `fn` the value of the child with these label values. `fn` is called
  // on every scrape, on the scraping thread and under this family's lock,
  // until the returned registration is destroyed: it must be cheap and
  // thread-safe, and must neither call into the registry nor destroy its own
  // registration. ALREADY_EXISTS if these label values already have one.
  absl::StatusOr<GaugeCallbackRegistration> AddCallback(
      absl::Span<const std::string> label_values, std::function<double()> fn)
      ABSL_LOCKS_EXCLUDED(mu_);

  void AppendText(std::string* out) const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class GaugeCallbackRegistration;
  void Remove(const std::vector<std::string>& label_values)
      ABSL_LOCKS_EXCLUDED(mu_);

  std::map<std::vector<std::string>, std::function<double()>> callbacks_
      ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*; label names match
  // [a-zA-Z_][a-zA-Z0-9_]*, must not start with "__" and must be distinct.
  absl::StatusOr<CounterFamily*> AddCounter(
      absl::string_view name, absl::string_view help,
      std::vector<std::string> label_names = {}) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<GaugeFamily*> AddGauge(
      absl::string_view name, absl::string_view help,
      std::vector<std::string> label_names = {}) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<CallbackGaugeFamily*> AddCallbackGauge(
      absl::string_view name, absl::string_view help,
      std::vector<std::string> label_names = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // `bounds` are the buckets' upper bounds: finite and strictly increasing;
  // the +Inf bucket is implicit. A histogram may not have a label named "le".
  absl::StatusOr<HistogramFamily*> AddHistogram(
      absl::string_view name, absl::string_view help,
      std::vector<std::string> label_names, std::vector<double> bounds)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Every family, ordered by name, in the text exposition format.
  std::string RenderText() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  template <typename F>
  absl::StatusOr<F*> Register(FamilyDefinition definition)
      ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<internal::FamilyBase>> families_
      ABSL_GUARDED_BY(mu_);
};

// Bucket bounds 1, 2 and 5 times each power of ten from 10^lowest_exponent up
// to 10^highest_exponent, which ends the list: (-5, 1) gives 10 us .. 10 s in
// 19 buckets. Each bound is the double nearest its decimal value, so it
// renders as written ("2e-05", not "2.0000000000000002e-05").
std::vector<double> OneTwoFiveBuckets(int lowest_exponent,
                                      int highest_exponent);

}  // namespace mla::metrics

#endif  // MLA_OFFLOAD_SERVER_METRICS_REGISTRY_H_
