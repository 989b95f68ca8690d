"""Sessions placed over several servers by rendezvous hashing, as the C++
client does (client/mla_client.h: RendezvousWeight, Cluster).

On Kubernetes the servers are a StatefulSet's pods, each with a stable DNS
name behind the headless Service (statefulset_targets makes the list);
gRPC resolves the names. Placement hashes the names, not the addresses,
so a pod that restarts under a new IP keeps its keys.

A session lives and dies with its server. When a server is lost (its pod
is gone, a call fails UNAVAILABLE), its sessions are gone with it: mark
it lost, create the sessions again (each lands on its next-highest
server) and append their KV again; the sessions of other servers stay
where they are. Nothing here marks a server lost by itself.
"""

import threading

import grpc

from .client import Client
from .errors import MlaOffloadError

_MASK = (1 << 64) - 1


def _fnv1a64(data):
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & _MASK
    return value


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def rendezvous_weight(session_key, target):
    """SplitMix64(Fnv1a64(key) ^ SplitMix64(Fnv1a64(target))) over UTF-8
    bytes: the C++ client's RendezvousWeight, bit for bit."""
    return _splitmix64(_fnv1a64(session_key.encode()) ^ _splitmix64(_fnv1a64(target.encode())))


def rendezvous_place(session_key, targets):
    """The index into targets of the highest weight for session_key (ties go
    to the smaller target string); None when targets is empty."""
    best, best_weight = None, 0
    for index, target in enumerate(targets):
        weight = rendezvous_weight(session_key, target)
        if (best is None or weight > best_weight
                or (weight == best_weight and target < targets[best])):
            best, best_weight = index, weight
    return best


def statefulset_targets(name, replicas, service=None, namespace=None, port=50051,
                        cluster_domain=None):
    """The DNS names of a StatefulSet's pods: NAME-0.SERVICE[.NAMESPACE.svc
    [.CLUSTER_DOMAIN]]:PORT ... NAME-(REPLICAS-1). service defaults to
    NAME-headless (deploy/k8s/base). Without namespace the names resolve in
    the client's own namespace."""
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas is {replicas!r}: give a whole number of at least 1")
    if not name:
        raise ValueError("name is empty: give the StatefulSet's name")
    if not 0 < port < 65536:
        raise ValueError(f"port is {port}: give 1 to 65535")
    host = service or f"{name}-headless"
    if namespace:
        host += f".{namespace}.svc"
        if cluster_domain:
            host += f".{cluster_domain}"
    elif cluster_domain:
        raise ValueError("cluster_domain needs namespace")
    return [f"{name}-{ordinal}.{host}:{port}" for ordinal in range(replicas)]


class Cluster:
    """One Client per target and the placement of sessions on them. Use as a
    context manager, or call close(). Keyword arguments go to each Client.

    place(key) is the live server with the highest weight for key;
    create_session(key, ...) places and creates the session there and
    returns (server index, Session): send every later call for the session
    to cluster.client(index), never to place(key) again (placement changes
    as servers are marked lost or alive; a session does not move)."""

    def __init__(self, targets, **client_options):
        targets = list(targets)
        if not targets:
            raise ValueError("targets is empty: give at least one HOST:PORT")
        if len(set(targets)) != len(targets):
            raise ValueError(f"targets repeats a target: {targets}")
        self.targets = targets
        self._clients = [Client(target, **client_options) for target in targets]
        self._alive = [True] * len(targets)
        self._lock = threading.Lock()

    def close(self):
        for client in self._clients:
            client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __len__(self):
        return len(self._clients)

    def client(self, server):
        return self._clients[server]

    def place(self, session_key):
        with self._lock:
            live = [i for i, alive in enumerate(self._alive) if alive]
        if not live:
            raise MlaOffloadError(grpc.StatusCode.UNAVAILABLE,
                                  "every server of the cluster is marked lost", "place")
        return live[rendezvous_place(session_key, [self.targets[i] for i in live])]

    def create_session(self, session_key, model, num_heads, **session_options):
        server = self.place(session_key)
        return server, self._clients[server].create_session(model, num_heads, **session_options)

    def mark_lost(self, server):
        with self._lock:
            self._alive[server] = False

    def mark_alive(self, server):
        with self._lock:
            self._alive[server] = True

    def alive(self, server):
        with self._lock:
            return self._alive[server]
