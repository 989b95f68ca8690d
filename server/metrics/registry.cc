#include "server/metrics/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace mla::metrics {
namespace {

// std::atomic<double> has no fetch_add before C++20.
void AtomicAdd(std::atomic<double>& target, double v) {
  double old = target.load(std::memory_order_relaxed);
  while (
      !target.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

// Integral values (counts, bytes) are written as integers. Others are written
// as Go's strconv.FormatFloat(v, 'g', -1, 64) writes them, since Go clients
// set the convention and Prometheus before 3.0 compares "le" values as
// strings: the shortest digits that read back to the same double, with an
// exponent when it is below -4 or at least 6 ("1e-05", "0.0001", "2.5").
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  constexpr double kExactIntegers = 9007199254740992.0;  // 2^53
  if (std::trunc(v) == v && std::abs(v) < kExactIntegers) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buffer[32];  // the longest shortest form, e.g. -2.2250738585072014e-308
  char* end = std::to_chars(buffer, buffer + sizeof(buffer), v,
                            std::chars_format::scientific)
                  .ptr;
  const char* e = std::find(buffer, end, 'e');
  int exponent = 0;
  std::from_chars(e + (e[1] == '+' ? 2 : 1), end, exponent);
  if (exponent >= -4 && exponent < 6) {
    end = std::to_chars(buffer, buffer + sizeof(buffer), v,
                        std::chars_format::fixed)
              .ptr;
  }
  return std::string(buffer, end);
}

std::string EscapeLabelValue(absl::string_view value) {
  return absl::StrReplaceAll(value,
                             {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

std::string EscapeHelp(absl::string_view help) {
  return absl::StrReplaceAll(help, {{"\\", "\\\\"}, {"\n", "\\n"}});
}

const char* TypeName(FamilyDefinition::Kind kind) {
  switch (kind) {
    case FamilyDefinition::Kind::kCounter:
      return "counter";
    case FamilyDefinition::Kind::kGauge:
    case FamilyDefinition::Kind::kCallbackGauge:
      return "gauge";
    case FamilyDefinition::Kind::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void AppendHeader(const FamilyDefinition& definition, std::string* out) {
  absl::StrAppend(out, "# HELP ", definition.name, " ",
                  EscapeHelp(definition.help), "\n# TYPE ", definition.name,
                  " ", TypeName(definition.kind), "\n");
}

// `name="value",...` for one child, values escaped.
std::string LabelPairs(const FamilyDefinition& definition,
                       absl::Span<const std::string> label_values) {
  std::string pairs;
  for (size_t i = 0; i < label_values.size(); ++i) {
    absl::StrAppend(&pairs, i > 0 ? "," : "", definition.label_names[i], "=\"",
                    EscapeLabelValue(label_values[i]), "\"");
  }
  return pairs;
}

// One line `name{labels} value`; no braces when there are no labels.
void AppendSample(absl::string_view name, absl::string_view suffix,
                  absl::string_view labels, absl::string_view value,
                  std::string* out) {
  absl::StrAppend(out, name, suffix);
  if (!labels.empty()) absl::StrAppend(out, "{", labels, "}");
  absl::StrAppend(out, " ", value, "\n");
}

// [first][rest]*, where first and rest are [a-zA-Z_] plus ':' for metric
// names, and rest also digits.
bool IsValidName(absl::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    c == '_' || (allow_colon && c == ':') ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

absl::Status ValidateDefinition(const FamilyDefinition& definition) {
  if (!IsValidName(definition.name, /*allow_colon=*/true)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid metric name \"", definition.name,
                     "\": it must match [a-zA-Z_:][a-zA-Z0-9_:]*"));
  }
  std::set<absl::string_view> seen;
  for (const std::string& label : definition.label_names) {
    if (!IsValidName(label, /*allow_colon=*/false) ||
        absl::StartsWith(label, "__")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric ", definition.name, ": invalid label name \"", label,
          "\": it must match [a-zA-Z_][a-zA-Z0-9_]* and not start with __"));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric ", definition.name, ": label \"", label, "\" given twice"));
    }
    if (definition.kind == FamilyDefinition::Kind::kHistogram &&
        label == "le") {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram ", definition.name,
          ": the label name \"le\" is reserved for bucket bounds"));
    }
  }
  const std::vector<double>& bounds = definition.bounds;
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i - 1] < bounds[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram ", definition.name,
          ": bucket bounds must be finite and strictly increasing (the +Inf "
          "bucket is implicit); got [",
          absl::StrJoin(
              bounds, ", ",
              [](std::string* out, double b) { out->append(FormatValue(b)); }),
          "]"));
    }
  }
  return absl::OkStatus();
}

std::string Describe(const FamilyDefinition& definition) {
  std::string text = absl::StrCat(
      TypeName(definition.kind),
      definition.kind == FamilyDefinition::Kind::kCallbackGauge ? " (callback)"
                                                                : "",
      " with labels [", absl::StrJoin(definition.label_names, ","),
      "] and help \"", definition.help, "\"");
  if (definition.kind == FamilyDefinition::Kind::kHistogram) {
    absl::StrAppend(&text, " and ", definition.bounds.size(), " buckets");
  }
  return text;
}

}  // namespace

void Counter::Add(double v) {
  // Written so that NaN fails the test too.
  if (!(v > 0)) return;
  AtomicAdd(fraction_, v);
}

double Counter::Value() const {
  return static_cast<double>(whole_.load(std::memory_order_relaxed)) +
         fraction_.load(std::memory_order_relaxed);
}

void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(absl::Span<const double> bounds)
    : bounds_(bounds), counts_(bounds.size() + 1) {}

void Histogram::Observe(double v) {
  // The first bound >= v; NaN compares false with every bound and so ends up
  // past the last one, in the +Inf bucket.
  const size_t bucket =
      std::partition_point(bounds_.begin(), bounds_.end(),
                           [v](double bound) { return !(bound >= v); }) -
      bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.cumulative_counts.reserve(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    snapshot.cumulative_counts.push_back(total);
  }
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

bool FamilyDefinition::operator==(const FamilyDefinition& other) const {
  return kind == other.kind && name == other.name && help == other.help &&
         label_names == other.label_names && bounds == other.bounds;
}

namespace internal {

absl::Status FamilyBase::CheckLabelCount(
    absl::Span<const std::string> values) const {
  if (values.size() == definition_.label_names.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "metric ", definition_.name, " has ", definition_.label_names.size(),
      " labels [", absl::StrJoin(definition_.label_names, ","), "]; got ",
      values.size(), " values"));
}

}  // namespace internal

void CounterFamily::AppendText(std::string* out) const {
  const FamilyDefinition& d = definition();
  AppendHeader(d, out);
  absl::MutexLock lock(&mu_);
  for (const auto& [values, counter] : children_) {
    // Integral counts are written from the uint64 so that they stay exact
    // beyond 2^53.
    const double fraction = counter->fraction_.load(std::memory_order_relaxed);
    const uint64_t whole = counter->whole_.load(std::memory_order_relaxed);
    AppendSample(d.name, "", LabelPairs(d, values),
                 fraction == 0
                     ? absl::StrCat(whole)
                     : FormatValue(static_cast<double>(whole) + fraction),
                 out);
  }
}

std::unique_ptr<Counter> CounterFamily::NewChild() const {
  return std::make_unique<Counter>();
}

void GaugeFamily::AppendText(std::string* out) const {
  const FamilyDefinition& d = definition();
  AppendHeader(d, out);
  absl::MutexLock lock(&mu_);
  for (const auto& [values, gauge] : children_) {
    AppendSample(d.name, "", LabelPairs(d, values), FormatValue(gauge->Value()),
                 out);
  }
}

std::unique_ptr<Gauge> GaugeFamily::NewChild() const {
  return std::make_unique<Gauge>();
}

void HistogramFamily::AppendText(std::string* out) const {
  const FamilyDefinition& d = definition();
  AppendHeader(d, out);
  absl::MutexLock lock(&mu_);
  for (const auto& [values, histogram] : children_) {
    const std::string labels = LabelPairs(d, values);
    const absl::string_view separator = labels.empty() ? "" : ",";
    const Histogram::Snapshot snapshot = histogram->Read();
    for (size_t i = 0; i <= d.bounds.size(); ++i) {
      const std::string le =
          i < d.bounds.size() ? FormatValue(d.bounds[i]) : "+Inf";
      AppendSample(d.name, "_bucket",
                   absl::StrCat(labels, separator, "le=\"", le, "\""),
                   absl::StrCat(snapshot.cumulative_counts[i]), out);
    }
    AppendSample(d.name, "_sum", labels, FormatValue(snapshot.sum), out);
    AppendSample(d.name, "_count", labels,
                 absl::StrCat(snapshot.cumulative_counts.back()), out);
  }
}

std::unique_ptr<Histogram> HistogramFamily::NewChild() const {
  return std::make_unique<Histogram>(definition().bounds);
}

GaugeCallbackRegistration::~GaugeCallbackRegistration() { Reset(); }

GaugeCallbackRegistration::GaugeCallbackRegistration(
    GaugeCallbackRegistration&& other) noexcept
    : family_(std::exchange(other.family_, nullptr)),
      label_values_(std::move(other.label_values_)) {}

GaugeCallbackRegistration& GaugeCallbackRegistration::operator=(
    GaugeCallbackRegistration&& other) noexcept {
  if (this != &other) {
    Reset();
    family_ = std::exchange(other.family_, nullptr);
    label_values_ = std::move(other.label_values_);
  }
  return *this;
}

void GaugeCallbackRegistration::Reset() {
  if (family_ != nullptr) family_->Remove(label_values_);
  family_ = nullptr;
}

absl::StatusOr<GaugeCallbackRegistration> CallbackGaugeFamily::AddCallback(
    absl::Span<const std::string> label_values, std::function<double()> fn) {
  if (absl::Status s = CheckLabelCount(label_values); !s.ok()) return s;
  std::vector<std::string> key(label_values.begin(), label_values.end());
  absl::MutexLock lock(&mu_);
  if (!callbacks_.try_emplace(key, std::move(fn)).second) {
    return absl::AlreadyExistsError(absl::StrCat(
        "metric ", definition().name, " already has a callback for [",
        absl::StrJoin(key, ","), "]"));
  }
  return GaugeCallbackRegistration(this, std::move(key));
}

void CallbackGaugeFamily::Remove(const std::vector<std::string>& label_values) {
  absl::MutexLock lock(&mu_);
  callbacks_.erase(label_values);
}

void CallbackGaugeFamily::AppendText(std::string* out) const {
  const FamilyDefinition& d = definition();
  AppendHeader(d, out);
  absl::MutexLock lock(&mu_);
  for (const auto& [values, fn] : callbacks_) {
    AppendSample(d.name, "", LabelPairs(d, values), FormatValue(fn()), out);
  }
}

template <typename F>
absl::StatusOr<F*> Registry::Register(FamilyDefinition definition) {
  if (absl::Status s = ValidateDefinition(definition); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  std::unique_ptr<internal::FamilyBase>& slot = families_[definition.name];
  if (slot == nullptr) {
    auto family = std::make_unique<F>(std::move(definition));
    F* result = family.get();
    slot = std::move(family);
    return result;
  }
  // Equal kinds imply equal family types, so the cast below is safe.
  if (!(slot->definition() == definition)) {
    return absl::AlreadyExistsError(
        absl::StrCat("metric ", definition.name, " is already registered as a ",
                     Describe(slot->definition()), "; cannot register it as a ",
                     Describe(definition)));
  }
  return static_cast<F*>(slot.get());
}

absl::StatusOr<CounterFamily*> Registry::AddCounter(
    absl::string_view name, absl::string_view help,
    std::vector<std::string> label_names) {
  return Register<CounterFamily>({FamilyDefinition::Kind::kCounter,
                                  std::string(name),
                                  std::string(help),
                                  std::move(label_names),
                                  {}});
}

absl::StatusOr<GaugeFamily*> Registry::AddGauge(
    absl::string_view name, absl::string_view help,
    std::vector<std::string> label_names) {
  return Register<GaugeFamily>({FamilyDefinition::Kind::kGauge,
                                std::string(name),
                                std::string(help),
                                std::move(label_names),
                                {}});
}

absl::StatusOr<CallbackGaugeFamily*> Registry::AddCallbackGauge(
    absl::string_view name, absl::string_view help,
    std::vector<std::string> label_names) {
  return Register<CallbackGaugeFamily>({FamilyDefinition::Kind::kCallbackGauge,
                                        std::string(name),
                                        std::string(help),
                                        std::move(label_names),
                                        {}});
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogram(
    absl::string_view name, absl::string_view help,
    std::vector<std::string> label_names, std::vector<double> bounds) {
  return Register<HistogramFamily>({FamilyDefinition::Kind::kHistogram,
                                    std::string(name), std::string(help),
                                    std::move(label_names), std::move(bounds)});
}

std::string Registry::RenderText() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, family] : families_) family->AppendText(&out);
  return out;
}

std::vector<double> OneTwoFiveBuckets(int lowest_exponent,
                                      int highest_exponent) {
  std::vector<double> bounds;
  for (int exponent = lowest_exponent; exponent <= highest_exponent;
       ++exponent) {
    for (int mantissa : {1, 2, 5}) {
      if (exponent == highest_exponent && mantissa > 1) break;
      // Parsing the decimal rounds once; multiplying powers of ten would not.
      bounds.push_back(
          std::strtod(absl::StrCat(mantissa, "e", exponent).c_str(), nullptr));
    }
  }
  return bounds;
}

}  // namespace mla::metrics
