#include "server/access/connection_gate.h"

#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla {
namespace {

// Connections past the limit are refused while the others hold calls; a
// connection already in may open more calls; a connection whose calls all
// ended makes room; a refusal changes nothing.
TEST(ConnectionGateTest, CountsConnectionsWithCallsRunning) {
  ConnectionGate gate(2);
  absl::StatusOr<ConnectionGate::Ticket> a1 = gate.Enter("ipv4:10.0.0.1:1");
  absl::StatusOr<ConnectionGate::Ticket> a2 = gate.Enter("ipv4:10.0.0.1:1");
  absl::StatusOr<ConnectionGate::Ticket> b = gate.Enter("ipv4:10.0.0.2:1");
  ASSERT_TRUE(a1.ok() && a2.ok() && b.ok());
  EXPECT_EQ(gate.connections(), 2);
  absl::StatusOr<ConnectionGate::Ticket> c = gate.Enter("ipv4:10.0.0.3:1");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr("--max_connections"));
  EXPECT_EQ(gate.connections(), 2);
  EXPECT_TRUE(gate.Enter("ipv4:10.0.0.1:1").ok()) << "a connection already in is not a new one";
  *a1 = ConnectionGate::Ticket();
  EXPECT_FALSE(gate.Enter("ipv4:10.0.0.3:1").ok()) << "a's other call still runs";
  *a2 = ConnectionGate::Ticket();
  EXPECT_EQ(gate.connections(), 1);
  absl::StatusOr<ConnectionGate::Ticket> d = gate.Enter("ipv4:10.0.0.3:1");
  EXPECT_TRUE(d.ok()) << d.status();
  // Moved tickets release once.
  ConnectionGate::Ticket moved = *std::move(d);
  EXPECT_EQ(gate.connections(), 2);
  moved = ConnectionGate::Ticket();
  EXPECT_EQ(gate.connections(), 1);
}

TEST(ConnectionGateTest, NoLimitAtZero) {
  ConnectionGate gate(0);
  std::vector<ConnectionGate::Ticket> tickets;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<ConnectionGate::Ticket> t = gate.Enter("ipv4:10.0.0.1:" + std::to_string(i));
    ASSERT_TRUE(t.ok());
    tickets.push_back(*std::move(t));
  }
  EXPECT_EQ(gate.connections(), 100);
}

}  // namespace
}  // namespace mla
