// How many client connections may hold calls at once (--max_connections).
// gRPC 1.51 (Debian's) has no cap on the connections it accepts, so the
// service caps what matters: connections doing work. A connection is
// gRPC's peer address ("ipv4:10.0.0.5:40122" is one TCP connection; every
// client on a Unix socket is the one peer "unix:"). A call enters with its
// peer and holds a Ticket until it ends; a call from a connection that
// holds none while `max` others hold some is RESOURCE_EXHAUSTED, naming the
// flag, and changes nothing. A connection without calls costs the server
// little and is closed by the idle timeout (--max_connection_idle_s).
//
// Thread-safe; Tickets may be released on any thread, and must not outlive
// the gate.
#ifndef MLA_OFFLOAD_SERVER_ACCESS_CONNECTION_GATE_H_
#define MLA_OFFLOAD_SERVER_ACCESS_CONNECTION_GATE_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

namespace mla {

class ConnectionGate {
 public:
  // At most `max` connections with calls; 0 or less: no limit.
  explicit ConnectionGate(int max) : max_(max) {}

  // Held by a call while it runs; released when destroyed.
  class Ticket {
   public:
    Ticket() = default;
    ~Ticket() { Release(); }
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    friend class ConnectionGate;
    Ticket(ConnectionGate* gate, std::string peer) : gate_(gate), peer_(std::move(peer)) {}
    void Release();
    ConnectionGate* gate_ = nullptr;
    std::string peer_;
  };

  absl::StatusOr<Ticket> Enter(const std::string& peer);
  // Connections holding calls now.
  int connections() const;

 private:
  void Leave(const std::string& peer);

  const int max_;
  mutable std::mutex mutex_;
  std::map<std::string, int> calls_;  // by peer, each above 0
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ACCESS_CONNECTION_GATE_H_
