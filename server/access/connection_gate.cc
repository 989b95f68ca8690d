#include "server/access/connection_gate.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace mla {

ConnectionGate::Ticket& ConnectionGate::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    gate_ = std::exchange(other.gate_, nullptr);
    peer_ = std::move(other.peer_);
  }
  return *this;
}

void ConnectionGate::Ticket::Release() {
  if (gate_ != nullptr) std::exchange(gate_, nullptr)->Leave(peer_);
}

absl::StatusOr<ConnectionGate::Ticket> ConnectionGate::Enter(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = calls_.find(peer);
  if (it == calls_.end()) {
    if (max_ > 0 && static_cast<int>(calls_.size()) >= max_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server serves ", max_, " client connections at once (--max_connections) and "
          "they all have calls running; retry later, share a connection, or ask the operator "
          "to raise --max_connections"));
    }
    it = calls_.emplace(peer, 0).first;
  }
  ++it->second;
  return Ticket(this, peer);
}

int ConnectionGate::connections() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(calls_.size());
}

void ConnectionGate::Leave(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = calls_.find(peer);
  if (it != calls_.end() && --it->second == 0) calls_.erase(it);
}

}  // namespace mla
