// region_holder TARGET NAME_FILE: a client for server_e2e_test that dies
// holding a region. It registers a shared-memory region with the server at
// TARGET (client/host_region.h), opens an Attend stream, writes the region's
// name to NAME_FILE, and then waits to be killed: it never unregisters, and
// a SIGKILL leaves its shared-memory object behind for the test to remove.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "client/host_region.h"
#include "client/mla_client.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "region_holder: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: region_holder TARGET NAME_FILE\n");
    return 2;
  }
  namespace client = ::mla::client;
  absl::StatusOr<std::unique_ptr<client::Client>> connected = client::Client::Connect(argv[1]);
  if (!connected.ok()) return Fail(connected.status());
  absl::StatusOr<std::unique_ptr<client::HostRegion>> region =
      client::HostRegion::Create(**connected, 1 << 20);
  if (!region.ok()) return Fail(region.status());
  absl::StatusOr<std::unique_ptr<client::AttendStream>> stream = (*connected)->OpenAttendStream();
  if (!stream.ok()) return Fail(stream.status());
  const std::string partial = std::string(argv[2]) + ".partial";
  std::ofstream(partial) << (*region)->name();
  // Whole or not at all, for the test that polls the file.
  std::rename(partial.c_str(), argv[2]);
  while (true) pause();
}
