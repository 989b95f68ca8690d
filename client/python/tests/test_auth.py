"""The client's token and TLS options against the real server with TLS and
bearer tokens (certificates made by tests/support/make_test_certs.sh with
openssl): the token names the tenant, a missing or wrong one is
UNAUTHENTICATED, another tenant's session is NOT_FOUND, and a token never
goes over plaintext to another host.
"""

import hashlib
import os
import pathlib
import subprocess
import tempfile
import unittest

import grpc

import mla_offload as mo
from server_process import ServerProcess


def make_test_certs_script():
    srcdir, workspace = os.environ.get("TEST_SRCDIR"), os.environ.get("TEST_WORKSPACE")
    if srcdir and workspace:
        return pathlib.Path(srcdir, workspace, "tests", "support", "make_test_certs.sh")
    return pathlib.Path(__file__).resolve().parents[3] / "tests" / "support" / "make_test_certs.sh"


def tokens_line(tenant, token, operator=False):
    return f"{tenant} {hashlib.sha256(token.encode()).hexdigest()}{' operator' if operator else ''}\n"


class AuthTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = pathlib.Path(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")))
        certs = cls.dir / "certs"
        subprocess.run(["/bin/bash", str(make_test_certs_script()), str(certs)], check=True)
        tokens = cls.dir / "tokens"
        tokens.write_text(tokens_line("alpha", "alpha-py-token") + tokens_line("beta", "beta-py-token"))
        cls.ca = (certs / "ca.pem").read_bytes()
        cls.server = ServerProcess([f"--tls_cert_file={certs / 'server.pem'}",
                                    f"--tls_key_file={certs / 'server.key'}",
                                    f"--auth_tokens_file={tokens}"])

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def connect(self, **kwargs):
        return mo.connect(self.server.target, tls=mo.TlsConfig(root_certificates=self.ca),
                          timeout=10.0, **kwargs)

    def test_the_token_names_the_tenant(self):
        with self.connect(token="alpha-py-token") as alpha, \
                self.connect(token="beta-py-token") as beta:
            session = alpha.create_session("deepseek-v4-flash", num_heads=8)
            self.assertEqual([s.session_id for s in alpha.list_sessions()], [session.session_id])
            self.assertEqual(alpha.list_sessions()[0].tenant, "alpha")
            self.assertEqual(beta.list_sessions(), [])
            with self.assertRaises(mo.MlaOffloadError) as raised:
                beta.close_session(session.session_id)
            self.assertEqual(raised.exception.code, grpc.StatusCode.NOT_FOUND)
            alpha.close_session(session.session_id)

    def test_a_missing_or_wrong_token_is_unauthenticated(self):
        for token in (None, "wrong-py-token"):
            with self.connect(token=token) as client:
                with self.assertRaises(mo.MlaOffloadError) as raised:
                    client.list_sessions()
            self.assertEqual(raised.exception.code, grpc.StatusCode.UNAUTHENTICATED)
            self.assertNotIn("wrong-py-token", str(raised.exception))

    def test_load_token_from_a_file_or_the_environment(self):
        path = self.dir / "alpha.token"
        path.write_text("alpha-py-token\n")
        self.assertEqual(mo.load_token(path), "alpha-py-token")
        os.environ["MLA_TEST_TOKEN"] = "beta-py-token"
        self.assertEqual(mo.load_token(env="MLA_TEST_TOKEN"), "beta-py-token")
        self.assertIsNone(mo.load_token(env="MLA_TEST_NO_SUCH_VARIABLE"))
        with self.connect(token=mo.load_token(path)) as client:
            self.assertEqual(client.list_sessions(), [])

    def test_a_token_never_goes_over_plaintext_to_another_host(self):
        with self.assertRaises(ValueError) as raised:
            mo.connect("10.1.2.3:50051", token="alpha-py-token")
        self.assertNotIn("alpha-py-token", str(raised.exception))
        with self.assertRaises(ValueError):
            mo.connect("127.0.0.1:1", token="two words")
        mo.connect("127.0.0.1:1", token="alpha-py-token").close()  # loopback: allowed


if __name__ == "__main__":
    unittest.main()
