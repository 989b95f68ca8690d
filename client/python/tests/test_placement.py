"""Rendezvous placement in Python: the C++ client's weights bit for bit
(client/placement_test.cc holds the same vectors), StatefulSet pod names,
and a Cluster of two real servers of which one is lost: only the lost
server's keys move, its sessions are gone, and they are created again on
the other server."""

import unittest

import grpc

import mla_offload as mo
from server_process import ServerProcess


class RendezvousTest(unittest.TestCase):
    def test_weights_are_the_cpp_clients(self):
        self.assertEqual(mo.rendezvous_weight("seq-1", "10.0.0.1:50051"), 0x113CCF9DE930EE00)
        self.assertEqual(mo.rendezvous_weight("seq-1", "10.0.0.2:50051"), 0xEC7174DDBAD5AFAB)
        self.assertEqual(mo.rendezvous_weight("", ""), 0xA0490B007FCA3C4B)
        targets = [f"10.0.0.{i}:50051" for i in (1, 2, 3)]
        self.assertEqual([mo.rendezvous_place(key, targets)
                          for key in ("seq-1", "seq-2", "seq-3", "request-42")], [1, 2, 0, 0])
        self.assertIsNone(mo.rendezvous_place("seq-1", []))

    def test_losing_a_target_moves_only_its_keys(self):
        targets = [f"mla-offload-{i}.mla-offload-headless:50051" for i in range(4)]
        without = targets[:2] + targets[3:]
        moved = 0
        for i in range(4000):
            key = f"seq-{i}"
            before = targets[mo.rendezvous_place(key, targets)]
            after = without[mo.rendezvous_place(key, without)]
            if before == targets[2]:
                moved += 1
            else:
                self.assertEqual(after, before, key)
        self.assertGreater(moved, 800)  # about a quarter
        self.assertLess(moved, 1200)

    def test_statefulset_targets(self):
        self.assertEqual(mo.statefulset_targets("mla-offload", 2),
                         ["mla-offload-0.mla-offload-headless:50051",
                          "mla-offload-1.mla-offload-headless:50051"])
        self.assertEqual(
            mo.statefulset_targets("s", 1, service="h", namespace="gpu", port=7000,
                                   cluster_domain="cluster.local"),
            ["s-0.h.gpu.svc.cluster.local:7000"])
        for bad in ({"replicas": 0}, {"replicas": 1.5}, {"port": 0}, {"cluster_domain": "x"}):
            with self.assertRaises(ValueError, msg=str(bad)):
                mo.statefulset_targets("s", **{"replicas": 1, **bad})


class ClusterTest(unittest.TestCase):
    def test_a_lost_server_loses_its_sessions_and_only_its_keys_move(self):
        servers = [ServerProcess(["--kv_cache_gb=0.5"]) for _ in range(2)]
        try:
            # Hostnames, resolved by gRPC through the resolver, as pod names are.
            targets = [server.target.replace("127.0.0.1", "localhost") for server in servers]
            with self.assertRaises(ValueError):
                mo.Cluster([])
            with self.assertRaises(ValueError):
                mo.Cluster([targets[0], targets[0]])
            with mo.Cluster(targets, timeout=30.0) as cluster:
                self.assertEqual(len(cluster), 2)
                keys = [f"seq-{i}" for i in range(12)]
                placed = {}
                for key in keys:
                    server, session = cluster.create_session(key, "deepseek-v4-flash", 8)
                    self.assertEqual(server, mo.rendezvous_place(key, targets))
                    placed[key] = (server, session)
                on_lost = [key for key in keys if placed[key][0] == 1]
                self.assertTrue(on_lost and len(on_lost) < len(keys), placed)

                servers[1].stop()
                lost_key = on_lost[0]
                with self.assertRaises(mo.MlaOffloadError) as raised:
                    cluster.client(1).list_sessions(timeout=5.0)
                self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
                cluster.mark_lost(1)
                self.assertFalse(cluster.alive(1))
                for key in keys:
                    self.assertEqual(cluster.place(key), 0, key)
                # The lost server's sessions are gone: created again, on server 0.
                server, again = cluster.create_session(lost_key, "deepseek-v4-flash", 8)
                self.assertEqual(server, 0)
                listed = {s.session_id for s in cluster.client(0).list_sessions()}
                for key in keys:
                    if placed[key][0] == 0:
                        self.assertIn(placed[key][1].session_id, listed, key)
                self.assertIn(again.session_id, listed)
                cluster.mark_lost(0)
                with self.assertRaises(mo.MlaOffloadError) as raised:
                    cluster.place(lost_key)
                self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
                cluster.mark_alive(0)
                self.assertEqual(cluster.place(lost_key), 0)
        finally:
            for server in servers:
                server.stop()


if __name__ == "__main__":
    unittest.main()
