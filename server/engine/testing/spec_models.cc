#include "server/engine/testing/spec_models.h"

#include <utility>

namespace mla::engine_testing {
namespace {

SpecModel MakeSpecModel(const std::string& name, std::vector<int> head, int pairs, int h_total,
                        int topk) {
  SpecModel model{name, h_total, topk, std::move(head)};
  for (int i = 0; i < pairs; ++i) {
    model.ratios.push_back(4);
    model.ratios.push_back(128);
  }
  model.ratios.push_back(4);
  model.ratios.push_back(0);
  return model;
}

}  // namespace

const SpecModel& Spec(absl::string_view name) {
  static const SpecModel* flash = new SpecModel(MakeSpecModel(kFlash, {0, 0}, 20, 64, 512));
  static const SpecModel* pro = new SpecModel(MakeSpecModel(kPro, {128, 128}, 29, 128, 1024));
  return name == kFlash ? *flash : *pro;
}

}  // namespace mla::engine_testing
