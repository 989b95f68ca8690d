#!/usr/bin/env python3
"""Replays a rendered StatefulSet's pod on this machine, as the kubelet would.

Usage: pod_replay_test.py RENDERED.yaml --server=BINARY --python_client=DIR

Reads the StatefulSet's server container and runs BINARY (the build of the
image's entrypoint, the command's first word) with exactly the container's
args and env, as the pod's runAsUser and runAsGroup, in a network namespace
of its own (the pod's: so its ports are the manifest's, and nothing else on
this machine is in the way). Then, as the
kubelet does:
  - the startup probe, then liveness and readiness, each at its own period and
    timeout against its gRPC service name and port, on a new connection each
    time; every containerPort must accept connections;
  - with an Attend stream in flight (messages sent and not yet answered), the
    termination: preStop (its exec command, run here), then SIGTERM, with the
    stream going on through the drain.
Checks: startup within its failure threshold; ready; liveness never fails,
drain included; readiness turns NOT_SERVING after SIGTERM; every step of the
stream, before and after SIGTERM, is answered OK; the process exits 0 within
terminationGracePeriodSeconds of the preStop's start. Exit status 0 when all
hold; each failure is printed.

DIR holds the Python client package (mla_offload with its generated stubs).
Run as root: the namespace is made with unshare(1) and ip(8).
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import yaml

IN_NAMESPACE = "MLA_POD_REPLAY_NETNS"
HERE = os.path.dirname(os.path.abspath(__file__))


def reexec_in_network_namespace():
    """Runs this script again in a new network namespace with loopback up."""
    command = " ".join(["ip link set lo up && exec", sys.executable] +
                       [f"'{arg}'" for arg in [os.path.abspath(__file__)] + sys.argv[1:]])
    env = dict(os.environ, **{IN_NAMESPACE: "1"})
    try:
        return subprocess.call(["unshare", "--net", "--", "sh", "-c", command], env=env)
    except FileNotFoundError:
        print("pod_replay: FAIL: unshare(1) is missing (util-linux)", file=sys.stderr)
        return 1


def server_container(path):
    """The StatefulSet and its container named "server" from a rendered file."""
    with open(path) as stream:
        documents = [d for d in yaml.safe_load_all(stream) if d]
    sets = [d for d in documents if d.get("kind") == "StatefulSet"]
    if len(sets) != 1:
        raise SystemExit(f"pod_replay: FAIL: {path} has {len(sets)} StatefulSets, not 1")
    pod = sets[0]["spec"]["template"]["spec"]
    containers = [c for c in pod["containers"] if c["name"] == "server"]
    if len(containers) != 1:
        raise SystemExit(f"pod_replay: FAIL: the StatefulSet has no container named server")
    return pod, containers[0]


def container_env(container):
    """The process environment of the container: PATH, HOME and its env."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/"}
    for variable in container.get("env", []):
        if "value" not in variable:
            raise SystemExit(f"pod_replay: FAIL: env {variable['name']} has no plain value "
                             "(valueFrom is not replayed)")
        env[variable["name"]] = str(variable["value"])
    return env


class Prober:
    """One kubelet probe: gRPC health Check of `service` on `port`, every
    periodSeconds, each on a new channel with timeoutSeconds."""

    def __init__(self, name, spec, client_module):
        self.name = name
        grpc_action = spec.get("grpc")
        if grpc_action is None:
            raise SystemExit(f"pod_replay: FAIL: the {name} probe is not a gRPC probe")
        self.port = int(grpc_action["port"])
        self.service = grpc_action.get("service", "")
        self.period = float(spec.get("periodSeconds", 10))
        self.timeout = float(spec.get("timeoutSeconds", 1))
        self.initial_delay = float(spec.get("initialDelaySeconds", 0))
        self.failure_threshold = int(spec.get("failureThreshold", 3))
        self.mo = client_module
        self.results = []  # (monotonic time, "SERVING" / "NOT_SERVING" / error)

    def check(self):
        try:
            with self.mo.connect(f"127.0.0.1:{self.port}", timeout=self.timeout) as client:
                status = client.health(service=self.service)
        except Exception as error:  # a failed probe, whatever the reason
            status = f"error: {str(error).splitlines()[0][:120]}"
        self.results.append((time.monotonic(), status))
        return status == "SERVING"

    def run(self, stop):
        """Probes until `stop` is set (the container has exited)."""
        if stop.wait(self.initial_delay):
            return
        while not stop.is_set():
            started = time.monotonic()
            self.check()
            stop.wait(max(0.0, self.period - (time.monotonic() - started)))


class Stream:
    """An Attend stream kept busy: layer-0 steps of one session, a few in
    flight at a time, until stopped; every answer is kept."""

    def __init__(self, mo, client, heads=8, prompt=64):
        sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python", "tests"))
        import numpy as np
        from server_test_case import prompt_layers, random_bf16
        self.np, self.random_bf16, self.mo = np, random_bf16, mo
        self.heads = heads
        model = client.model("deepseek-v4-flash")
        self.rng = np.random.default_rng(7)
        self.session = client.create_session(model.name, heads)
        client.append_kv(self.session, 0, prompt_layers(self.rng, model, 0, prompt))
        self.position = prompt
        self.stream = client.attend(max_in_flight=4)
        self.futures = []  # (monotonic time sent, future)
        self.stop = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            while not self.stop.is_set():
                future = self.stream.submit(
                    layer=0, segments=[self.mo.Segment(self.session, self.position)],
                    q=self.random_bf16(self.rng, (1, self.heads, 512)),
                    kv=self.random_bf16(self.rng, (1, 512)))
                self.futures.append((time.monotonic(), future))
                self.position += 1
                time.sleep(0.01)
        except Exception as error:
            self.error = error

    def in_flight(self):
        return sum(1 for _, future in self.futures if not future.done())

    def finish(self):
        """Stops sending; the outcome of every step: (time sent, error or None)."""
        self.stop.set()
        self.thread.join(30)
        outcomes = []
        for sent, future in self.futures:
            try:
                result = future.result(30)
                ok = result.out.shape == (1, self.heads, 512)
                outcomes.append((sent, None if ok else f"out shape {result.out.shape}"))
            except Exception as error:
                outcomes.append((sent, str(error).splitlines()[0][:200]))
        self.stream.close()
        return outcomes


def wait_for_port(port, deadline):
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("rendered")
    parser.add_argument("--server", required=True)
    parser.add_argument("--python_client", required=True)
    args = parser.parse_args()
    if os.environ.get(IN_NAMESPACE) != "1":
        if os.geteuid() != 0:
            print("pod_replay: FAIL: run as root (a network namespace of its own)", file=sys.stderr)
            return 1
        return reexec_in_network_namespace()

    sys.path.insert(0, os.path.abspath(args.python_client))
    import mla_offload as mo

    pod, container = server_container(args.rendered)
    command = container.get("command", [])
    if not command or os.path.basename(command[0]) != "mla_offload_server":
        print(f"pod_replay: FAIL: the command {command} does not run mla_offload_server", file=sys.stderr)
        return 1
    argv = [os.path.abspath(args.server)] + command[1:] + container.get("args", [])
    grace = float(pod.get("terminationGracePeriodSeconds", 30))
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    probes = {name: Prober(name, container[name + "Probe"], mo)
              for name in ("startup", "liveness", "readiness")}
    ports = [int(p["containerPort"]) for p in container.get("ports", [])]
    failures = []

    def check(condition, message):
        if not condition:
            failures.append(message)
            print(f"pod_replay: FAIL: {message}", file=sys.stderr)
        return condition

    # As the pod's user: the binary copied where that user can run it.
    security = pod.get("securityContext", {})
    user, group = security.get("runAsUser"), security.get("runAsGroup")
    binary_dir = tempfile.mkdtemp()
    os.chmod(binary_dir, 0o755)
    argv[0] = shutil.copy(argv[0], binary_dir)
    print(f"pod_replay: as uid {user} gid {group}: {' '.join(argv[1:])}")
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(argv, env=container_env(container), stdout=log, stderr=subprocess.STDOUT,
                               cwd="/", user=user, group=group, extra_groups=[] if group else None)
    exited = threading.Event()
    threading.Thread(target=lambda: (process.wait(), exited.set()), daemon=True).start()
    try:
        # Startup: until one success, at most failureThreshold failures.
        startup = probes["startup"]
        time.sleep(startup.initial_delay)
        started = False
        for _ in range(startup.failure_threshold):
            attempt = time.monotonic()
            if startup.check():
                started = True
                break
            if exited.wait(max(0.0, startup.period - (time.monotonic() - attempt))):
                break
        if not check(started, f"the startup probe did not succeed in {startup.failure_threshold} tries "
                              f"({startup.results[-3:]})"):
            return 1
        for port in ports:
            check(wait_for_port(port, time.monotonic() + 5), f"containerPort {port} does not accept connections")
        threads = [threading.Thread(target=probes[name].run, args=(exited,), daemon=True)
                   for name in ("liveness", "readiness")]
        for thread in threads:
            thread.start()
        readiness = probes["readiness"]
        deadline = time.monotonic() + readiness.period * 3 + readiness.timeout
        while not any(s == "SERVING" for _, s in readiness.results) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not check(any(s == "SERVING" for _, s in readiness.results),
                     f"never ready: readiness probes {readiness.results}"):
            return 1

        client = mo.connect(f"127.0.0.1:{probes['readiness'].port}", timeout=30.0)
        stream = Stream(mo, client)
        stream.thread.start()
        deadline = time.monotonic() + 10
        while len(stream.futures) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)

        # Termination: preStop, then SIGTERM, the stream still sending.
        terminating = time.monotonic()
        print(f"pod_replay: preStop {pre_stop}")
        try:
            subprocess.run(pre_stop, check=True, timeout=grace)
        except (subprocess.SubprocessError, OSError) as error:
            check(False, f"preStop {pre_stop} failed within the grace period of {grace:.0f} s: {error}")
            return 1
        while stream.in_flight() == 0 and time.monotonic() < terminating + grace:
            time.sleep(0.001)
        in_flight = stream.in_flight()
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        print(f"pod_replay: SIGTERM after {signalled - terminating:.1f} s, {in_flight} steps in flight")
        check(in_flight > 0, "no step of the stream was in flight at SIGTERM")
        # Go on until a readiness probe has seen the drain (a period or two).
        deadline = signalled + readiness.period * 2 + readiness.timeout + 1
        while (not any(w > signalled and s != "SERVING" for w, s in readiness.results)
               and time.monotonic() < deadline and not exited.is_set()):
            time.sleep(0.05)
        # And what a liveness probe would get now, in the middle of the drain
        # (its period is longer than the drain here).
        if not exited.is_set():
            probes["liveness"].check()
        time.sleep(0.2)
        outcomes = stream.finish()
        client.close()
        stream_closed = time.monotonic()
        check(stream.error is None, f"the stream's sender failed: {stream.error}")
        after = [o for o in outcomes if o[0] > signalled]
        bad = [o for o in outcomes if o[1] is not None]
        print(f"pod_replay: {len(outcomes)} steps, {len(after)} sent after SIGTERM, {len(bad)} not answered OK")
        check(not bad, f"steps not answered OK: {bad[:3]}")
        check(len(after) > 0, "no step was sent after SIGTERM")
        exited.wait(max(0.0, terminating + grace - time.monotonic()))
        if not check(exited.is_set(), f"still running {grace:.0f} s (terminationGracePeriodSeconds) "
                                      "after the preStop began: the kubelet would kill it"):
            return 1
        took = time.monotonic() - terminating
        print(f"pod_replay: exited {process.returncode} {took:.1f} s after the preStop began "
              f"(grace {grace:.0f} s)")
        check(process.returncode == 0, f"exit status {process.returncode}, not 0")
        ready_after = [s for w, s in readiness.results if w > signalled]
        check("NOT_SERVING" in ready_after, f"readiness after SIGTERM: {ready_after}, never NOT_SERVING")
        # Liveness: "" stays SERVING through the drain. Only a probe that
        # could not reach the server once its last stream had closed (the
        # server stopping) may fail.
        liveness = probes["liveness"]
        failed = [(round(w - signalled, 2), s) for w, s in liveness.results
                  if s == "NOT_SERVING" or (s != "SERVING" and w < stream_closed)]
        check(not failed, f"liveness failed while the process ran (s after SIGTERM, status): {failed}")
        print(f"pod_replay: probes: liveness {len(liveness.results)} "
              f"({sum(s == 'SERVING' for _, s in liveness.results)} SERVING), "
              f"readiness {len(readiness.results)}, after SIGTERM {ready_after}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.seek(0)
        output = log.read()
        log.close()
        shutil.rmtree(binary_dir)
        if failures:
            print("pod_replay: the server's output:\n" + output, file=sys.stderr)
    if failures:
        return 1
    print("pod_replay: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
