// The command-line flags of how a tool connects (the mla CLI, the load
// test): TLS, mutual TLS and a bearer token, read into ConnectOptions.
//
// Flags: --tls, --tls_ca, --tls_cert, --tls_key, --tls_server_name, and the
// token from the first of --token_file=PATH (the file's one line), the
// environment variable that --token_env names (MLA_OFFLOAD_TOKEN by
// default) and --token (visible to other users of the host in the process
// list: for trying things out). The token is never printed: errors name the
// flag or variable it came from, never its value, and its flags' defaults
// (what --help shows) are empty.
#ifndef MLA_OFFLOAD_CLIENT_CONNECT_FLAGS_H_
#define MLA_OFFLOAD_CLIENT_CONNECT_FLAGS_H_

#include "absl/status/statusor.h"
#include "client/mla_client.h"

namespace mla::client {

// ConnectOptions with the flags' TLS and token (the rest as `base` has it);
// INVALID_ARGUMENT naming the flag that is wrong (a PEM file that cannot be
// read, --tls_cert without --tls_key, a TLS flag without --tls, an empty
// token file).
absl::StatusOr<ConnectOptions> ConnectOptionsFromFlags(ConnectOptions base = {});

}  // namespace mla::client

#endif  // MLA_OFFLOAD_CLIENT_CONNECT_FLAGS_H_
