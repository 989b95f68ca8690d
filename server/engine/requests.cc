#include "server/engine/requests.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace mla {

std::string EchoClientText(absl::string_view text) {
  constexpr size_t kMaxEchoed = 64;
  if (text.size() <= kMaxEchoed) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, kMaxEchoed)), "... (", text.size(),
                      " bytes)");
}

}  // namespace mla
