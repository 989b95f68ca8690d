#!/usr/bin/env python3
"""Checks what the rendered manifests promise an operator (docs/operations.md).

Usage: manifests_test.py --containerfile=FILE OVERLAY=RENDERED.yaml...

Overlay names: cpu, gpu-h200 (each an overlay of deploy/k8s/overlays) and
components (deploy/tests/components: the cpu overlay with every optional
component). The schema check is kubernetes-validate's (deploy/check.sh);
this one checks the deployment's own rules: the objects of the base, probes
on the right gRPC names and ports, a grace period that covers preStop and
the drain, the security context, requests and limits, metrics in the
annotations, the NetworkPolicy and the Services, the GPU overlay's GPU, and
that the optional components stay out of the overlays. Prints every broken
rule; exit status 1 when there is one.
"""

import json
import re
import sys

import yaml

READINESS = "mla_offload.v1.MlaOffload"
GRACE_MARGIN_S = 5


class Checker:
    def __init__(self, overlay):
        self.overlay = overlay
        self.failures = []

    def expect(self, condition, message):
        if not condition:
            self.failures.append(f"{self.overlay}: {message}")
        return condition


def flag(args, name):
    """The value of --name=VALUE in args, or None."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return values[-1] if values else None


def entrypoint(containerfile):
    """The exec-form ENTRYPOINT of the Containerfile's last stage."""
    lines = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", open(containerfile).read(), re.M)
    return json.loads(lines[-1]) if lines else None


def check_overlay(name, documents, image_entrypoint):
    c = Checker(name)
    by_kind = {}
    for document in documents:
        by_kind.setdefault(document["kind"], []).append(document)
    for kind in ("StatefulSet", "Service", "PodDisruptionBudget", "ServiceAccount", "NetworkPolicy"):
        c.expect(kind in by_kind, f"no {kind}")
    if "StatefulSet" not in by_kind:
        return c.failures
    sts = by_kind["StatefulSet"][0]
    pod = sts["spec"]["template"]["spec"]
    labels = sts["spec"]["template"]["metadata"].get("labels", {})
    server = [x for x in pod["containers"] if x["name"] == "server"]
    if not c.expect(len(server) == 1, "no container named server"):
        return c.failures
    server = server[0]
    args = server.get("args", [])
    c.expect(server.get("command") == image_entrypoint,
             f"command {server.get('command')} is not the image's ENTRYPOINT {image_entrypoint}")

    # Ports: --listen's and --metrics_listen's, named grpc and metrics.
    ports = {p["name"]: p["containerPort"] for p in server.get("ports", [])}
    listen = flag(args, "listen") or ""
    grpc_port = int(listen.rsplit(":", 1)[1]) if ":" in listen else None
    metrics_listen = flag(args, "metrics_listen") or ""
    metrics_port = int(metrics_listen.rsplit(":", 1)[1]) if ":" in metrics_listen else -1
    c.expect(ports.get("grpc") == grpc_port, f"port grpc {ports.get('grpc')} is not --listen's {grpc_port}")
    c.expect(ports.get("metrics") == metrics_port,
             f"port metrics {ports.get('metrics')} is not --metrics_listen's {metrics_port}")

    # Probes: gRPC on the server's port; "" for liveness, the service's name
    # for readiness.
    for probe, service in (("startupProbe", ""), ("livenessProbe", ""), ("readinessProbe", READINESS)):
        spec = server.get(probe, {}).get("grpc")
        if c.expect(spec is not None, f"{probe} is not a gRPC probe"):
            c.expect(spec.get("port") == grpc_port, f"{probe} asks port {spec.get('port')}, not {grpc_port}")
            c.expect(spec.get("service", "") == service,
                     f"{probe} asks service '{spec.get('service', '')}', not '{service}'")
    startup = server.get("startupProbe", {})
    c.expect(startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) >= 60,
             "the startup probe gives the server less than 60 s to start")

    # Termination: grace >= preStop + --drain_seconds + margin.
    pre_stop = server.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep_s = int(pre_stop[1]) if len(pre_stop) == 2 and pre_stop[0] == "/bin/sleep" else None
    drain = flag(args, "drain_seconds")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if (c.expect(sleep_s is not None, f"preStop is {pre_stop}, not [/bin/sleep, N]") and
            c.expect(drain is not None, "no --drain_seconds in args")):
        c.expect(sleep_s > 0, "preStop sleeps 0 s: endpoints have no time to go before the drain")
        c.expect(grace >= sleep_s + int(drain) + GRACE_MARGIN_S,
                 f"terminationGracePeriodSeconds {grace} < preStop {sleep_s} + --drain_seconds "
                 f"{drain} + {GRACE_MARGIN_S}")

    # Security.
    pod_security = pod.get("securityContext", {})
    security = server.get("securityContext", {})
    c.expect(pod_security.get("runAsNonRoot") is True, "runAsNonRoot is not true")
    c.expect(pod_security.get("runAsUser", 0) != 0, "runAsUser is root")
    c.expect(pod_security.get("seccompProfile", {}).get("type") == "RuntimeDefault",
             "seccompProfile is not RuntimeDefault")
    c.expect(security.get("readOnlyRootFilesystem") is True, "the root filesystem is not read-only")
    c.expect(security.get("allowPrivilegeEscalation") is False, "privilege escalation is allowed")
    c.expect(security.get("capabilities", {}).get("drop") == ["ALL"], "capabilities are not all dropped")
    c.expect(pod.get("automountServiceAccountToken") is False, "a service account token is mounted")

    # Requests and limits.
    resources = server.get("resources", {})
    for field in ("cpu", "memory"):
        c.expect(field in resources.get("requests", {}), f"no {field} request")
    c.expect("memory" in resources.get("limits", {}), "no memory limit")

    # Metrics: the scrape annotations name the metrics port.
    annotations = sts["spec"]["template"]["metadata"].get("annotations", {})
    c.expect(annotations.get("prometheus.io/scrape") == "true", "no prometheus.io/scrape annotation")
    c.expect(annotations.get("prometheus.io/port") == str(metrics_port),
             f"prometheus.io/port is {annotations.get('prometheus.io/port')}, not {metrics_port}")

    # Services: a headless one named by the StatefulSet, and a ClusterIP one,
    # both selecting the pods.
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    headless = services.get(sts["spec"].get("serviceName"))
    if c.expect(headless is not None, f"no Service named serviceName {sts['spec'].get('serviceName')}"):
        c.expect(headless["spec"].get("clusterIP") == "None", "the StatefulSet's Service is not headless")
    c.expect(any(s["spec"].get("type", "ClusterIP") == "ClusterIP" and s["spec"].get("clusterIP") != "None"
                 for s in services.values()), "no ClusterIP Service")
    for service in services.values():
        selector = service["spec"].get("selector", {})
        c.expect(selector and all(labels.get(k) == v for k, v in selector.items()),
                 f"Service {service['metadata']['name']} does not select the pods")
    for pdb in by_kind.get("PodDisruptionBudget", []):
        selector = pdb["spec"].get("selector", {}).get("matchLabels", {})
        c.expect(selector and all(labels.get(k) == v for k, v in selector.items()),
                 "the PodDisruptionBudget does not select the pods")

    # NetworkPolicy: ingress to exactly the gRPC and the metrics port, the
    # metrics port from Prometheus pods only.
    for policy in by_kind.get("NetworkPolicy", []):
        selector = policy["spec"].get("podSelector", {}).get("matchLabels", {})
        c.expect(selector and all(labels.get(k) == v for k, v in selector.items()),
                 "the NetworkPolicy does not select the pods")
        rules = policy["spec"].get("ingress", [])
        allowed = sorted(p["port"] for rule in rules for p in rule.get("ports", []))
        c.expect(allowed == sorted([grpc_port, metrics_port]),
                 f"the NetworkPolicy lets in ports {allowed}, not {sorted([grpc_port, metrics_port])}")
        for rule in rules:
            if any(p["port"] == metrics_port for p in rule.get("ports", [])):
                c.expect(all("podSelector" in peer and "namespaceSelector" in peer for peer in rule["from"]),
                         "metrics are let in from more than Prometheus's pods")

    # Backends and GPUs.
    gpus = resources.get("limits", {}).get("nvidia.com/gpu")
    if name == "gpu-h200":
        c.expect(flag(args, "backend") == "cuda", "--backend is not cuda")
        c.expect(str(gpus) == "1", f"nvidia.com/gpu limit is {gpus}, not 1 (one GPU a pod)")
        c.expect(bool(pod.get("nodeSelector")), "no nodeSelector for GPU nodes")
        c.expect(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
                 "no toleration of the nvidia.com/gpu taint")
        c.expect(float(flag(args, "kv_cache_gb") or 0) >= 100, "--kv_cache_gb is not sized for an H200")
    else:
        c.expect(flag(args, "backend") in (None, "cpu"), f"--backend is {flag(args, 'backend')}")
        c.expect(gpus is None, "asks for a GPU")

    # Optional components: off in the overlays, there in the fixture.
    volumes = {v["name"] for v in pod.get("volumes", [])}
    has_components = "ServiceMonitor" in by_kind and {"tls", "tokens"} <= volumes
    if name == "components":
        c.expect(has_components, "the components fixture has no ServiceMonitor or TLS volumes")
    else:
        c.expect("ServiceMonitor" not in by_kind, "the ServiceMonitor component is on")
        c.expect(not volumes & {"tls", "tokens"}, "the TLS component is on (it is opt-in: the Secrets are the operator's)")
    return c.failures


def main(argv):
    containerfile = None
    failures = []
    overlays = []
    for arg in argv[1:]:
        if arg.startswith("--containerfile="):
            containerfile = arg.split("=", 1)[1]
        else:
            overlays.append(arg.split("=", 1))
    image_entrypoint = entrypoint(containerfile)
    if image_entrypoint is None:
        failures.append(f"{containerfile}: no exec-form ENTRYPOINT")
    for name, path in overlays:
        try:
            with open(path) as stream:
                documents = [d for d in yaml.safe_load_all(stream) if d]
        except (OSError, yaml.YAMLError) as error:
            failures.append(f"{name}: cannot read {path}: {error}")
            continue
        failures += check_overlay(name, documents, image_entrypoint)
        print(f"manifests: {name}: {len(documents)} objects checked")
    for failure in failures:
        print(f"manifests: FAIL: {failure}", file=sys.stderr)
    if not failures:
        print("manifests: PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
