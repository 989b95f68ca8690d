#!/bin/bash
# Makes the certificates of the TLS tests with openssl, into DIR:
#   ca.pem ca.key                  the test CA
#   server.pem server.key          the server (DNS mla-offload.test and localhost,
#                                  IP 127.0.0.1 and ::1), signed by the CA
#   alpha.pem alpha.key            a client of tenant alpha (CN=alpha), signed by the CA
#   beta.pem beta.key              a client of tenant beta (CN=beta)
#   expired.pem expired.key        CN=alpha, signed by the CA, expired yesterday
#   other_ca.pem other_ca.key      another CA
#   wrong_ca.pem wrong_ca.key      CN=alpha, signed by the other CA
#   other_server.pem other_server.key  the server's names, signed by the other CA
#                                  (for rotating the server certificate)
# EC P-256 keys; valid for 2 days (expired.pem: ended 1 day ago).
#
#   tests/support/make_test_certs.sh DIR
set -euo pipefail
dir=${1:?usage: make_test_certs.sh DIR}
mkdir -p "$dir"
cd "$dir"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }
ca() {
  key "$1"
  openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 2 -out "$1.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
# leaf NAME CN CA DAYS EXTENSIONS
leaf() {
  key "$1"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  printf '%s\n' "$5" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days "$4" \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
server_ext='subjectAltName=DNS:mla-offload.test,DNS:localhost,IP:127.0.0.1,IP:::1
extendedKeyUsage=serverAuth'
client_ext='extendedKeyUsage=clientAuth'

ca ca "mla-offload test CA"
ca other_ca "another CA"
leaf server mla-offload.test ca 2 "$server_ext"
leaf other_server mla-offload.test other_ca 2 "$server_ext"
leaf alpha alpha ca 2 "$client_ext"
leaf beta beta ca 2 "$client_ext"
leaf expired alpha ca -1 "$client_ext"
leaf wrong_ca alpha other_ca 2 "$client_ext"
rm -f ./*.srl
