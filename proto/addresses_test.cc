#include "proto/addresses.h"

#include "gtest/gtest.h"

namespace mla::wire {
namespace {

TEST(AddressesTest, UnixSocketsAndLoopbackOnly) {
  for (const char* address :
       {"unix:/run/mla.sock", "unix-abstract:mla", "localhost:50051", "127.0.0.1:50051",
        "127.255.0.9:1", "ipv4:127.0.0.1:5", "[::1]:50051", "ipv6:[::1]:50051",
        "ipv6:%5B::1%5D:5000", "ipv6:[::ffff:127.0.0.2]:5", "dns:///localhost:50051"}) {
    EXPECT_TRUE(IsLoopbackAddress(address)) << address;
  }
  for (const char* address :
       {"10.0.0.1:50051", "0.0.0.0:50051", "[::]:50051", "192.168.1.2:1",
        "mla-offload-0.mla-offload-headless:50051", "128.0.0.1:5", "127.0.0:5",
        "127.0.0.256:5", "127.0.0.1", "127.0.0.01a:5", "[::2]:5", "ipv6:[::ffff:10.0.0.1]:5",
        "xlocalhost:5", "", "unixx:/a", "127.0.0.-1:5", "ipv4:10.1.1.1:5"}) {
    EXPECT_FALSE(IsLoopbackAddress(address)) << address;
  }
}

}  // namespace
}  // namespace mla::wire
