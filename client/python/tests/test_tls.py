"""TLS and call metadata from the client's side.

test_auth.py runs the real server with TLS and tokens; the other end here
is an in-process gRPC Python server with the same generated service, serving Echo
and ListSessions over TLS with a self-signed test certificate for
"mla-offload.test" (testdata/, valid until 2126). It checks what the client
sends (TLS channel, name override, metadata), not what the real server
computes.
"""

import concurrent.futures
import pathlib
import unittest

import grpc

import mla_offload as mo
from mla_offload._stubs import pb, pb_grpc

TESTDATA = pathlib.Path(__file__).resolve().parent / "testdata"


class RecordingService(pb_grpc.MlaOffloadServicer):
    """Echo, and ListSessions answering with the caller's metadata."""

    def Echo(self, request_iterator, context):
        for message in request_iterator:
            yield message

    def ListSessions(self, request, context):
        metadata = dict(context.invocation_metadata())
        if metadata.get("authorization") != "Bearer test-token":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "authorization: missing or wrong token")
        return pb.ListSessionsResponse(sessions=[pb.SessionInfo(session_id="seen-token")])


class TlsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.certificate = (TESTDATA / "server_cert.pem").read_bytes()
        key = (TESTDATA / "server_key.pem").read_bytes()
        cls.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_MlaOffloadServicer_to_server(RecordingService(), cls.server)
        cls.port = cls.server.add_secure_port(
            "127.0.0.1:0", grpc.ssl_server_credentials([(key, cls.certificate)]))
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(None)

    def connect(self, **kwargs):
        return mo.connect(f"127.0.0.1:{self.port}", timeout=10.0, **kwargs)

    def test_tls_channel_with_the_servers_name(self):
        tls = mo.TlsConfig(root_certificates=self.certificate, server_name="mla-offload.test")
        with self.connect(tls=tls, metadata=[("authorization", "Bearer test-token")]) as client:
            self.assertEqual(client.echo([b"over TLS"]), [b"over TLS"])
            self.assertEqual([s.session_id for s in client.list_sessions()], ["seen-token"])

    def test_missing_token_is_unauthenticated_with_the_servers_message(self):
        tls = mo.TlsConfig(root_certificates=self.certificate, server_name="mla-offload.test")
        with self.connect(tls=tls) as client:
            with self.assertRaises(mo.MlaOffloadError) as raised:
                client.list_sessions()
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn("authorization", raised.exception.message)

    def test_a_certificate_for_another_name_is_refused(self):
        tls = mo.TlsConfig(root_certificates=self.certificate, server_name="elsewhere.test")
        with self.connect(tls=tls) as client:
            with self.assertRaises(mo.MlaOffloadError) as raised:
                client.echo([b"x"], timeout=5.0)
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_plaintext_to_a_tls_server_fails(self):
        with self.connect() as client:
            with self.assertRaises(mo.MlaOffloadError) as raised:
                client.echo([b"x"], timeout=5.0)
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_tls_and_channel_credentials_exclude_each_other(self):
        with self.assertRaises(ValueError):
            self.connect(tls=mo.TlsConfig(), channel_credentials=grpc.ssl_channel_credentials())
