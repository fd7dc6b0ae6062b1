"""Checks the Kubernetes sidecar manifests, file by file: they parse, and the
pieces that must agree do (socket path, shared memory, probes on the listen
port, the leader's DNS name, the headless Service selecting the Pods). Each
file holds one workload: an Indexed Job (a fixed job) or a StatefulSet (an
elastic job: --min-nodes below --num-nodes, replicas = --num-nodes =
--max-nodes, since nodes cannot join yet), with the headless Service the
daemons reach the leader through; or, with the rendezvous in etcd
(--rendezvous etcd://...), no Service at all; the real gradsyncd accepts
each sidecar's flags."""
import os
import shlex
import subprocess
import sys
import tempfile

import yaml


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def mounts(container):
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def flag(args, name):
    words = shlex.split(args.replace("\\\n", " "))
    for i, w in enumerate(words):
        if w == name and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(name + "="):
            return w.split("=", 1)[1]
    return None


def daemon_flag(script, env, name):
    """A gradsyncd flag's value: its GRADSYNCD_* variable, else the command line."""
    var = "GRADSYNCD_" + name[2:].upper().replace("-", "_")
    return env[var] if env.get(var) is not None else flag(script, name)


# Where each workload's Pods read their node rank from (the downward API).
RANK_FIELD = {
    "Job": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
    "StatefulSet": "metadata.labels['apps.kubernetes.io/pod-index']",
}


def main(paths, gradsyncd=None):
    total = 0
    for p in paths:
        with open(p) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        check_manifest(p, docs, gradsyncd)
        total += len(docs)
    print(f"PASS: {total} documents in {len(paths)} file(s)")


def check_workload(path, workload, svc):
    """The Job's or StatefulSet's own rules; returns its Pod template. `svc`:
    the leader's Service, None with the rendezvous in etcd."""
    spec = workload["spec"]
    pod = spec["template"]
    if workload["kind"] == "Job":
        check(spec.get("completionMode") == "Indexed", f"{path}: the Job must be Indexed")
        if svc is not None:
            check(pod["spec"].get("subdomain") == svc["metadata"]["name"],
                  f"{path}: Pod subdomain must name the Service")
    else:
        check(svc is not None and spec.get("serviceName") == svc["metadata"]["name"],
              f"{path}: serviceName must name the Service")
        # The daemons rendezvous before any is ready: OrderedReady would
        # wait forever for Pod 0.
        check(spec.get("podManagementPolicy") == "Parallel",
              f"{path}: the StatefulSet needs podManagementPolicy: Parallel")
        labels = pod["metadata"]["labels"]
        for k, v in spec["selector"]["matchLabels"].items():
            check(labels.get(k) == v, f"{path}: selector {k}={v} does not match the Pod labels")
    return pod


def check_elastic(path, workload, env):
    """A StatefulSet is an elastic job whose replicas are its nodes."""
    num = int(env["GRADSYNCD_NUM_NODES"])
    low = int(env.get("GRADSYNCD_MIN_NODES") or num)
    high = int(env.get("GRADSYNCD_MAX_NODES") or num)
    replicas = workload["spec"].get("replicas", 1)
    check(replicas == num, f"{path}: replicas {replicas} must equal --num-nodes {num}")
    check(1 <= low < num, f"{path}: --min-nodes {low} must be in [1, --num-nodes {num}) "
                          "for the StatefulSet to be elastic")
    check(high == num, f"{path}: --max-nodes {high} must equal --num-nodes {num} "
                       "(nodes cannot join a running job yet)")


def check_manifest(path, docs, gradsyncd):
    for d in docs:
        check("apiVersion" in d and "kind" in d and d.get("metadata", {}).get("name"),
              f"{path}: document without apiVersion/kind/name: {d}")
    services = [d for d in docs if d["kind"] == "Service"]
    workloads = [d for d in docs if d["kind"] in RANK_FIELD]
    check(len(workloads) == 1, f"{path}: expected one Job or StatefulSet")
    check(len(services) <= 1, f"{path}: expected at most one Service")
    job = workloads[0]
    svc = services[0] if services else None

    pod = check_workload(path, job, svc)
    spec = pod["spec"]
    labels = pod["metadata"]["labels"]
    check(spec.get("shareProcessNamespace") is True, "shareProcessNamespace must be true")

    sidecars = [c for c in spec.get("initContainers", []) if c["name"] == "gradsyncd"]
    check(len(sidecars) == 1, "gradsyncd must be an init container (native sidecar)")
    daemon = sidecars[0]
    check(daemon.get("restartPolicy") == "Always", "the gradsyncd sidecar needs restartPolicy: Always")
    trainers = [c for c in spec["containers"] if c["name"] == "trainer"]
    check(len(trainers) == 1, "one trainer container expected")
    trainer = trainers[0]

    command = daemon.get("command", []) + daemon.get("args", [])
    check(command and command[0].endswith("/gradsyncd"),
          f"the sidecar must run gradsyncd itself, not {command[:2]}")
    check(not any(c in ("sh", "bash") or c.endswith(("/sh", "/bash")) or c == "-c"
                  for c in command),
          f"no shell in the sidecar's command: {command}")
    script = "\n".join(command)
    daemon_env = {e["name"]: e.get("value") for e in daemon.get("env", [])}
    socket = daemon_flag(script, daemon_env, "--socket")
    listen = daemon_flag(script, daemon_env, "--listen")
    check(socket and listen, "gradsyncd needs --socket and --listen")
    port = int(listen.rsplit(":", 1)[1])
    check(listen.startswith("0.0.0.0:"), "--listen must bind the Pod IP for probes and peers")
    check(any(p["containerPort"] == port for p in daemon.get("ports", [])),
          "the listen port must be a containerPort")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check(daemon.get(probe, {}).get("grpc", {}).get("port") == port,
              f"{probe} must be a grpc probe on port {port}")
    rendezvous = daemon_flag(script, daemon_env, "--rendezvous")
    if rendezvous:
        check_etcd_rendezvous(rendezvous, script, daemon, daemon_env, svc, spec)
    else:
        check_leader_rendezvous(job, svc, labels, port, script, daemon_env)
    rank = next((e for e in daemon.get("env", []) if e["name"] == "GRADSYNCD_NODE_RANK"), {})
    check(rank.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == RANK_FIELD[job["kind"]],
          f"GRADSYNCD_NODE_RANK must be the {job['kind']}'s Pod index ({RANK_FIELD[job['kind']]})")
    if job["kind"] == "StatefulSet":
        check_elastic(path, job, daemon_env)

    metrics = daemon_flag(script, daemon_env, "--metrics-listen")
    check(metrics, "gradsyncd needs --metrics-listen for Prometheus")
    metrics_port = int(metrics.rsplit(":", 1)[1])
    check(any(p["containerPort"] == metrics_port for p in daemon.get("ports", [])),
          "the metrics port must be a containerPort")
    notes = pod["metadata"].get("annotations", {})
    check(notes.get("prometheus.io/scrape") == "true"
          and notes.get("prometheus.io/port") == str(metrics_port)
          and notes.get("prometheus.io/path") == "/metrics",
          f"the Pod must be annotated for scraping port {metrics_port} at /metrics")

    env = {e["name"]: e.get("value") for e in trainer.get("env", [])}
    check(env.get("GRADSYNC_SOCKET") == socket, "trainer GRADSYNC_SOCKET must equal --socket")
    # The system socket (common/defaults.h kSystemSocketPath), which trainers
    # also find without GRADSYNC_SOCKET.
    check(socket == "/run/gradsync/gradsyncd.sock",
          f"--socket {socket} must be /run/gradsync/gradsyncd.sock (the trainers' default)")
    # The trainer trusts a daemon of its own user (or GRADSYNC_DAEMON_UID's).
    ctx = spec.get("securityContext", {})
    for c in (daemon, trainer):
        uid = c.get("securityContext", {}).get("runAsUser", ctx.get("runAsUser"))
        check(uid is not None and uid == ctx.get("runAsUser") or "GRADSYNC_DAEMON_UID" in env,
              f"{c['name']} must run as the Pod's runAsUser, or the trainer must name the "
              "daemon's uid in GRADSYNC_DAEMON_UID")

    volumes = {v["name"]: v for v in spec["volumes"]}
    shm = [n for n, v in volumes.items()
           if v.get("emptyDir", {}).get("medium") == "Memory"
           and mounts(daemon).get(n) == "/dev/shm"]
    check(len(shm) == 1, "a medium: Memory emptyDir must be mounted at /dev/shm in gradsyncd")
    check(mounts(trainer).get(shm[0]) == "/dev/shm", "the trainer must share that /dev/shm")
    sock_dir = socket.rsplit("/", 1)[0]
    shared = [n for n, path in mounts(daemon).items()
              if path == sock_dir and mounts(trainer).get(n) == sock_dir]
    check(len(shared) == 1 and "emptyDir" in volumes[shared[0]],
          f"both containers must mount one emptyDir at {sock_dir}")
    for c in (daemon, trainer):
        for name in mounts(c):
            check(name in volumes, f"{c['name']} mounts unknown volume {name}")
    token = daemon_flag(script, daemon_env, "--job-token-file")
    secret_dirs = [path for n, path in mounts(daemon).items() if "secret" in volumes.get(n, {})]
    check(token and any(token.startswith(d + "/") for d in secret_dirs),
          f"--job-token-file {token} must be read in place from a Secret volume {secret_dirs}")
    if gradsyncd:
        check_flags_parse(gradsyncd, daemon, command)
        if job["kind"] == "StatefulSet":
            check_shape_accepted(gradsyncd, daemon, command, int(daemon_env["GRADSYNCD_NUM_NODES"]))


def check_leader_rendezvous(job, svc, labels, port, script, daemon_env):
    """The embedded rendezvous: node 0 leads, reached through a headless
    Service that names every Pod."""
    check(svc is not None, "expected one Service (the leader's DNS name)")
    check(svc["spec"].get("clusterIP") == "None", "the Service must be headless")
    check(svc["spec"].get("publishNotReadyAddresses") is True,
          "the leader must resolve before it is ready")
    for k, v in svc["spec"]["selector"].items():
        check(labels.get(k) == v, f"Service selector {k}={v} does not match the Pod labels")
    check(svc["spec"]["ports"][0]["port"] == port, "the Service must expose the listen port")
    leader = f'{job["metadata"]["name"]}-0.{svc["metadata"]["name"]}:{port}'
    check(daemon_flag(script, daemon_env, "--leader") == leader,
          f"every node (node 0 names itself) must use --leader {leader}")


def check_etcd_rendezvous(rendezvous, script, daemon, daemon_env, svc, spec):
    """The rendezvous in etcd: every node names the same etcd cluster, none
    leads, and etcd's client certificate is read from a Secret volume."""
    check(rendezvous.startswith("etcd://") and "/" in rendezvous[len("etcd://"):],
          f"--rendezvous {rendezvous} must be etcd://HOST:PORT[,HOST:PORT...]/PREFIX")
    check(daemon_flag(script, daemon_env, "--leader") is None,
          "with --rendezvous etcd:// no node is given --leader")
    check(svc is None, "the etcd variant needs no Service: no node is reached by name")
    volumes = {v["name"]: v for v in spec["volumes"]}
    secret_dirs = [path for n, path in mounts(daemon).items() if "secret" in volumes.get(n, {})]
    for name in ("--etcd-cert", "--etcd-key", "--etcd-ca"):
        value = daemon_flag(script, daemon_env, name)
        check(value and any(value.startswith(d + "/") for d in secret_dirs),
              f"{name} {value} must be read from a Secret volume {secret_dirs}")
    min_nodes = daemon_flag(script, daemon_env, "--min-nodes")
    num_nodes = daemon_flag(script, daemon_env, "--num-nodes")
    check(min_nodes and num_nodes and int(min_nodes) < int(num_nodes),
          "the etcd variant shows an elastic job: --min-nodes below --num-nodes")


def run_sidecar(gradsyncd, daemon, command, extra):
    """The real gradsyncd with the sidecar's environment and arguments
    (downward-API values filled in, the token copied to a scratch file) and
    `extra` flags that make it stop at validation."""
    with tempfile.TemporaryDirectory() as scratch:
        token = os.path.join(scratch, "token")
        with open(token, "w") as f:
            f.write("s3cret\n")
        os.chmod(token, 0o600)
        env = {"PATH": "/usr/bin:/bin"}
        for e in daemon.get("env", []):
            value = e.get("value")
            if value is None:  # the downward API: a rank and a Pod IP
                value = {"GRADSYNCD_NODE_RANK": "1", "GRADSYNCD_HOST": "127.0.0.1"}[e["name"]]
            env[e["name"]] = value
        env["GRADSYNCD_JOB_TOKEN_FILE"] = token
        env["GRADSYNCD_SOCKET"] = os.path.join(scratch, "s.sock")
        return subprocess.run([gradsyncd] + command[1:] + extra, env=env,
                              capture_output=True, text=True, timeout=60)


def check_flags_parse(gradsyncd, daemon, command):
    """--num-nodes=0 stops gradsyncd at its first check: reaching it means
    every GRADSYNCD_* variable named a flag and every value parsed."""
    run = run_sidecar(gradsyncd, daemon, command, ["--num-nodes=0"])
    check(run.returncode == 2 and "--num-nodes 0 is not in [1, 4096]" in run.stderr,
          f"gradsyncd did not accept the sidecar's flags: exit {run.returncode}, "
          f"{run.stderr.strip()}")


def check_shape_accepted(gradsyncd, daemon, command, num_nodes):
    """--node-rank=num_nodes is the job shape's last check, after the
    elastic range's (--min-nodes, --max-nodes, the backend): reaching it
    means gradsyncd accepts that range."""
    run = run_sidecar(gradsyncd, daemon, command, [f"--node-rank={num_nodes}"])
    want = f"--node-rank {num_nodes} is not in [0, {num_nodes})"
    check(run.returncode == 2 and want in run.stderr,
          f"gradsyncd refused the elastic sidecar's job shape: exit {run.returncode}, "
          f"{run.stderr.strip()}")


if __name__ == "__main__":
    args = sys.argv[1:]
    binary = None
    if args and args[0].startswith("--gradsyncd="):
        binary = args.pop(0).split("=", 1)[1]
    main(args, binary)
