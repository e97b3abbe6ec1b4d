#!/usr/bin/env bash
# Renders deploy/kubernetes (the base and every overlay) with `kubectl
# kustomize` and checks what comes out: every object against the
# Kubernetes schemas, offline and strict (kubernetes-validate, from PyPI,
# installed once into ~/.cache/filedock); every image pinned (a tag other
# than latest, or a digest); every Deployment's containers with a
# readiness probe on /readyz and a liveness probe on /healthz; the pods'
# termination grace longer than the drain they run (preStop +
# FILEDOCK_DRAIN_READY_GRACE_SECS + FILEDOCK_DRAIN_SECS for the requests and
# as long again for the workers); no Secret in the files.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${FILEDOCK_CACHE:-$HOME/.cache/filedock}"
VALIDATE_VERSION=1.34.1
KUBERNETES_VERSION=1.32.0
venv="$CACHE/kubernetes-validate"
if ! "$venv/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$VALIDATE_VERSION"; then
  echo "[k8s] installing kubernetes-validate $VALIDATE_VERSION into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "kubernetes-validate==$VALIDATE_VERSION"
fi
command -v kubectl >/dev/null || { echo "[k8s] kubectl is needed (kubectl kustomize)" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
dirs=(deploy/kubernetes/base deploy/kubernetes/overlays/*)
for dir in "${dirs[@]}"; do
  name="$(basename "$dir")"
  kubectl kustomize "$dir" >"$out/$name.yaml"
  "$venv/bin/kubernetes-validate" --strict --quiet -k "$KUBERNETES_VERSION" "$out/$name.yaml"
  "$venv/bin/python" - "$out/$name.yaml" "$dir" <<'PY'
import re, sys, yaml

path, where = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
problems = []
kinds = {d["kind"] for d in docs}
for kind in ["Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "CronJob", "ConfigMap"]:
    if kind not in kinds:
        problems.append(f"no {kind}")
if "Secret" in kinds:
    problems.append("a Secret is in the files (reference it; create it apart)")

def pod_spec(d):
    if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        return d["spec"]["template"]["spec"]
    if d["kind"] == "CronJob":
        return d["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if d["kind"] == "Pod":
        return d["spec"]
    return None

PROBES = {"readinessProbe": "/readyz", "livenessProbe": "/healthz"}

config = {}
for d in docs:
    if d["kind"] == "ConfigMap":
        config.update(d.get("data", {}))
for d in docs:
    spec = pod_spec(d)
    if spec is None:
        continue
    name = f'{d["kind"]}/{d["metadata"]["name"]}'
    for c in spec["containers"] + spec.get("initContainers", []):
        image = c["image"]
        digest = "@sha256:" in image
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        if not digest and (not tag or tag == "latest"):
            problems.append(f"{name}: image {image} is not pinned")
        ctx = c.get("securityContext", {})
        if not ctx.get("readOnlyRootFilesystem") or ctx.get("allowPrivilegeEscalation", True):
            problems.append(f"{name}: {c['name']} may write its root filesystem or escalate")
        if not spec.get("securityContext", {}).get("runAsNonRoot"):
            problems.append(f"{name}: may run as root")
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet") and c in spec["containers"]:
            for probe, path in PROBES.items():
                got = c.get(probe, {}).get("httpGet", {}).get("path")
                if got != path:
                    problems.append(f"{name}: {c['name']} has no {probe} on {path} (has {got})")
            stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            pre = int(stop[-1]) if stop[:1] == ["sleep"] else 0
            # The requests get FILEDOCK_DRAIN_SECS, then the workers as long again.
            drain = int(config.get("FILEDOCK_DRAIN_READY_GRACE_SECS", 5)) + 2 * int(config.get("FILEDOCK_DRAIN_SECS", 30))
            grace = spec.get("terminationGracePeriodSeconds", 30)
            if grace <= pre + drain:
                problems.append(f"{name}: terminationGracePeriodSeconds {grace} <= preStop {pre} + drain {drain}")
if problems:
    sys.exit(f"[k8s] {where}:\n  " + "\n  ".join(problems))
print(f"[k8s] {where}: {len(docs)} objects valid ({', '.join(sorted(kinds))}); images pinned, probes and drain in place", file=sys.stderr)
PY
done
