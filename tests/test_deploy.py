"""The deploy files' command lines are ones the real ``litz`` / ``litzctl`` parsers accept.

Docker and Kubernetes are not available on this machine, so the manifests cannot run here; what can rot
silently is the Litz side of them: a renamed flag, a missing argument. Every ``litz``/``litzctl`` invocation
in the compose file, the Kubernetes manifests (containers, init containers, preStop hooks) and the shell
scripts is extracted and parsed by the CLI's own argparse parser.
"""
from __future__ import annotations

import contextlib
import functools
import io
import ipaddress
import os
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

from litz.cli import litz as litz_cli
from litz.cli import litzctl as litzctl_cli
from tests.support.etcd import start_one
from tests.support.processes import run_cli

DEPLOY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy")
K8S = os.path.join(DEPLOY, "kubernetes")
MAKE_CERTS = os.path.join(DEPLOY, "make-etcd-certs.sh")
PARSERS = {"litz": litz_cli.build_parser, "litzctl": litzctl_cli.build_parser}
# the start of a litz or litzctl command in a shell line: line start, after ; && || | ( or a shell keyword
COMMAND = re.compile(r"(?:^|[;&|(]|\b(?:exec|until|while|do|then|if)\s)\s*(litzctl|litz)\s+([^;&|\n]*)")


def expand(text: str) -> str:
    """Placeholders for what the orchestrator or shell fills in (``1``: valid as a name and as a number),
    keeping the word structure."""
    text = text.replace("\\\n", " ").replace('"$@"', "").replace("$@", "")  # "$@": extra options, maybe none
    text = re.sub(r"\$\{[A-Za-z_]+:-([^}]*)\}", r"\1", text)       # compose/shell ${VAR:-default}
    text = re.sub(r"\$\$?\([^()]*(?:\([^()]*\)[^()]*)*\)", "1", text)  # $(VAR) (k8s), $(cmd), $$(cmd) (compose)
    text = re.sub(r"\$\{?[A-Za-z_][A-Za-z_0-9]*\}?", "1", text)       # $VAR, ${VAR}
    return text


def invocations(shell: str) -> list[tuple[str, list[str]]]:
    out = []
    for line in expand(shell).splitlines():
        line = line.split(" #", 1)[0]
        for prog, rest in COMMAND.findall(line):
            words = shlex.split(re.split(r"\s\d?>", rest, maxsplit=1)[0])
            if prog == "litz" and words and words[0] == "1":  # litz "$role" ...: each role it starts
                out += [(prog, [role, *words[1:]]) for role in ("worker", "server")]
            else:
                out.append((prog, words))
    return out


def parse(prog: str, words: list[str]) -> str | None:
    """None if the parser accepts ``words``, else its error message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            PARSERS[prog]().parse_args(words)
    except SystemExit as e:
        return None if e.code == 0 else err.getvalue().strip().splitlines()[-1]
    return None


def own_env(doc: dict, configmaps: dict[str, dict]) -> dict[str, str]:
    """The variables a compose service or a Kubernetes container sets: compose's ``environment``, the
    ConfigMaps in ``envFrom`` and the literal ``env`` values (downward-API ones stay placeholders)."""
    env: dict[str, str] = {}
    environment = doc.get("environment")
    if isinstance(environment, dict):
        env.update({k: str(v) for k, v in environment.items() if v is not None})
    elif isinstance(environment, list):
        env.update(item.split("=", 1) for item in environment if isinstance(item, str) and "=" in item)
    for ref in doc.get("envFrom") or []:
        if isinstance(ref, dict):
            env.update(configmaps.get((ref.get("configMapRef") or {}).get("name"), {}))
    for item in doc.get("env") or []:
        if isinstance(item, dict) and "value" in item:
            env[item["name"]] = str(item["value"])
    return env


VARIABLES = {  # how a variable the file itself sets is written where it gets expanded, in sh -c scripts
    "k8s": (r"\$\((\w+)\)", r"\$\{(\w+)\}", r"\$(\w+)"),  # Kubernetes expands $(VAR), then the shell $VAR
    "hook": (r"\$\{(\w+)\}", r"\$(\w+)"),                   # exec hooks: Kubernetes expands nothing
    "compose": (r"\$\$\{(\w+)\}", r"\$\$(\w+)"),             # $$VAR: the container's shell ($VAR is compose's)
    "k8s-args": (r"\$\((\w+)\)",),                            # a container's command and args without a shell
    "none": (),                                               # compose commands and hooks without a shell
}
ARGS_STYLE = {"k8s": "k8s-args", "hook": "none", "compose": "none"}


def resolve(text: str, env: dict[str, str], style: str) -> str:
    """The values of the variables the deploy files set themselves (the ConfigMap, compose's environment),
    put in as Kubernetes, compose and the shell would; everything else is left to :func:`expand`."""
    for pattern in VARIABLES[style]:
        text = re.sub(pattern, lambda m: env.get(m.group(1), m.group(0)), text)
    return text


def container_commands(doc, configmaps: dict[str, dict] | None = None, env: dict[str, str] | None = None,
                       style: str = "k8s") -> list[tuple[list[str], dict[str, str], str]]:
    """Every command (command + args) in a compose file or a Kubernetes object, preStop hooks included, with
    the variables set for it and how they are written (see :data:`VARIABLES`)."""
    found = []
    if isinstance(doc, dict):
        env = {**(env or {}), **own_env(doc, configmaps or {})}
        if "command" in doc and isinstance(doc["command"], list):
            found.append(([str(w) for w in doc["command"] + doc.get("args", [])], env, style))
        elif "command" in doc and isinstance(doc["command"], str):
            found.append((["sh", "-c", doc["command"]], env, style))
        for key, value in doc.items():
            found.extend(container_commands(value, configmaps, env, "hook" if key == "lifecycle" else style))
    elif isinstance(doc, list):
        for value in doc:
            found.extend(container_commands(value, configmaps, env, style))
    return found


def litz_calls(command: list[str], env: dict[str, str] | None = None,
               style: str = "k8s") -> list[tuple[str, list[str]]]:
    env = env or {}
    if command[:2] == ["sh", "-c"]:
        return invocations(resolve(command[2], env, style))
    if command and command[0] in PARSERS:
        words = [resolve(w, env, ARGS_STYLE[style]) for w in command[1:]]
        return [(command[0], shlex.split(expand(shlex.join(words))))]
    return []


def load_manifests() -> dict[str, list]:
    """The compose file and every Kubernetes manifest, by path relative to deploy/."""
    paths = [os.path.join(DEPLOY, "docker-compose.yml")]
    paths += [os.path.join(K8S, f) for f in sorted(os.listdir(K8S)) if f.endswith(".yaml")]
    out = {}
    for path in paths:
        with open(path) as f:
            out[os.path.relpath(path, DEPLOY)] = [d for d in yaml.safe_load_all(f) if d is not None]
    return out


def configmaps(docs: list) -> dict[str, dict]:
    return {d["metadata"]["name"]: {k: str(v) for k, v in d.get("data", {}).items()}
            for d in docs if isinstance(d, dict) and d.get("kind") == "ConfigMap"}


def manifest_calls() -> dict[str, list[tuple[str, list[str]]]]:
    manifests = load_manifests()
    maps = configmaps([d for path, docs in manifests.items() if path.startswith("kubernetes") for d in docs])
    calls = {}
    for path, docs in manifests.items():
        style = "compose" if path == "docker-compose.yml" else "k8s"
        commands = [c for d in docs for c in container_commands(d, maps, style=style)]
        calls[path] = [c for cmd, env, st in commands for c in litz_calls(cmd, env, st)]
    return calls


# a bash array assigned on one line: NAME=(...) or NAME+=(...)
ARRAY = re.compile(r"^[ \t]*([A-Za-z_]\w*)\+?=\((.*)\)[ \t]*$", re.M)


def inline_arrays(text: str) -> str:
    """"${NAME[@]}" replaced by the words assigned to NAME, all its assignments together: the array as the
    script builds it with every option on (local-cluster.sh adds the TLS options when openssl is there)."""
    words: dict[str, str] = {}
    for name, value in ARRAY.findall(text):
        words[name] = f"{words.get(name, '')} {value}".strip()
    return re.sub(r'"\$\{([A-Za-z_]\w*)\[@\]\}"', lambda m: words.get(m.group(1), ""), text)


def script_calls() -> dict[str, list[tuple[str, list[str]]]]:
    calls = {}
    for name in ("slurm/litz.sbatch", "local-cluster.sh"):
        with open(os.path.join(DEPLOY, name)) as f:
            text = "\n".join(line for line in f.read().splitlines() if not line.lstrip().startswith(("#", "echo")))
        calls[name] = invocations(inline_arrays(text))
    return calls


@pytest.mark.timeout(60)
def test_every_role_and_control_command_in_the_manifests_parses() -> None:
    calls = manifest_calls()
    seen = {(prog, words[0]) for cs in calls.values() for prog, words in cs if words}
    # the compose file and the manifests start every role, and Kubernetes drains in a preStop hook
    for role in ("master", "worker", "server"):
        assert ("litz", role) in seen, f"no file starts a litz {role}"
    assert any(words[:1] != [] and "drain" in words for cs in calls.values() for _, words in cs)
    errors = [f"{path}: {prog} {' '.join(words)}: {err}" for path, cs in calls.items() for prog, words in cs
              if (err := parse(prog, words))]
    assert not errors, "\n".join(errors)


@pytest.mark.timeout(60)
def test_the_shell_scripts_are_valid_and_their_litz_commands_parse() -> None:
    for name, cs in script_calls().items():
        path = os.path.join(DEPLOY, name)
        check = subprocess.run(["bash", "-n", path], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, f"{name}: {check.stderr}"
        assert cs, f"{name}: no litz command found"
        errors = [f"{prog} {' '.join(words)}: {err}" for prog, words in cs if (err := parse(prog, words))]
        assert not errors, f"{name}:\n" + "\n".join(errors)


def test_a_wrong_flag_is_caught() -> None:
    """The check itself can fail: a flag the CLI does not know is reported."""
    (prog, words), = invocations('exec litz worker --etcd etcd:2379 --name "$JOB" --no-such-flag 1')
    assert prog == "litz" and words[0] == "worker"
    assert "unrecognized arguments" in parse(prog, words)


# -- a secured etcd first: TLS with client certificates everywhere ---------------------------------------------

TLS_FILES = {"etcd_cacert": "ca.crt", "etcd_cert": "client.crt", "etcd_key": "client.key"}  # option: file


def parsed(prog: str, words: list[str]):
    assert parse(prog, words) is None, f"{prog} {' '.join(words)}: {parse(prog, words)}"
    return PARSERS[prog]().parse_args(words)


def flags(words: list[str]) -> dict[str, str]:
    """etcd's and etcdctl's --key=value options (a bare --key is 'true')."""
    out = {}
    for w in words:
        if w.startswith("--"):
            key, sep, value = w[2:].partition("=")
            out[key] = value if sep else "true"
    return out


def test_every_litz_command_in_every_deploy_file_uses_tls_with_a_client_certificate() -> None:
    """Secure first: no litz/litzctl in the compose file, the manifests or the scripts talks to etcd without
    --etcd-cacert, --etcd-cert and --etcd-key."""
    calls = {**manifest_calls(), **script_calls()}
    plain = [f"{path}: {prog} {' '.join(words)}" for path, cs in calls.items() for prog, words in cs
             if not all(getattr(parsed(prog, words), option) for option in TLS_FILES)]
    assert not plain, "without TLS options:\n" + "\n".join(plain)
    running = {path for path, cs in calls.items() if cs}
    assert running == {"docker-compose.yml", "kubernetes/master.yaml", "kubernetes/worker.yaml",
                       "kubernetes/server.yaml", "slurm/litz.sbatch", "local-cluster.sh"}, running


def secret_generators() -> dict[str, dict[str, str]]:
    """kustomization.yaml's secretGenerator: Secret name -> {key in the Secret: file it is made from}."""
    with open(os.path.join(K8S, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    return {g["name"]: dict(item.split("=", 1) for item in g["files"]) for g in kustomization["secretGenerator"]}


def mounted_from(path: str, mounts: dict[str, str | None], generated: dict[str, dict]) -> tuple[str, str] | None:
    """(Secret, key) if ``path`` is a file mounted from a generated Secret, else None."""
    directory, name = os.path.split(path)
    secret = mounts.get(directory)
    return (secret, name) if secret and name in generated[secret] else None


@pytest.mark.timeout(60)
def test_kubernetes_etcd_serves_only_tls_and_every_litz_container_mounts_the_client_certificate() -> None:
    docs = [d for path, ds in load_manifests().items() if path.startswith("kubernetes") for d in ds]
    maps = configmaps(docs)
    generated = secret_generators()
    server_secrets, client_secrets, litz_containers = set(), set(), 0
    for doc in docs:
        if doc.get("kind") not in ("Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        assert set(secrets.values()) <= set(generated), f"{doc['metadata']['name']}: {secrets}"
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{doc['metadata']['name']}/{c['name']}"
            mounts = {m["mountPath"]: secrets.get(m["name"]) for m in c.get("volumeMounts", [])}
            in_secret = functools.partial(mounted_from, mounts=mounts, generated=generated)
            if c["name"] == "etcd":
                opts = flags(c["command"] + c.get("args", []))
                assert opts["listen-client-urls"].startswith("https://"), opts
                assert opts["advertise-client-urls"].startswith("https://"), opts
                assert opts["client-cert-auth"] == "true", opts
                secret = in_secret(opts["cert-file"])[0]
                for option, name in (("cert-file", "server.crt"), ("key-file", "server.key"),
                                     ("trusted-ca-file", "ca.crt")):
                    assert in_secret(opts[option]) == (secret, name), (option, opts[option], mounts)
                probe = flags(c["readinessProbe"]["exec"]["command"])  # the probe needs a certificate too
                assert probe["endpoints"].startswith("https://"), probe
                assert all(in_secret(probe[option]) for option in ("cacert", "cert", "key")), probe
                server_secrets.add(secret)
                continue
            for cmd, env, style in container_commands(c, maps):
                for prog, words in litz_calls(cmd, env, style):
                    args = parsed(prog, words)
                    for option, name in TLS_FILES.items():
                        found = in_secret(getattr(args, option))
                        assert found and found[1] == name, f"{where}: --{option.replace('_', '-')} " \
                            f"{getattr(args, option)} is not {name} from a mounted generated Secret ({mounts})"
                        client_secrets.add(found[0])
                    litz_containers += 1
    # etcd's certificate and the clients' come from different Secrets, with the same CA
    assert len(server_secrets) == 1 and len(client_secrets) == 1 and server_secrets != client_secrets
    (server,), (client,) = server_secrets, client_secrets
    assert generated[server]["ca.crt"] == generated[client]["ca.crt"]
    assert "server.key" not in generated[client] and not any("ca.key" in g.values() for g in generated.values())
    assert litz_containers >= 8  # 3 roles, 3 init containers, 2 preStop hooks
    # and, as defence in depth, the NetworkPolicy in front of etcd stays
    assert any(d.get("kind") == "NetworkPolicy"
               and d["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == "etcd"
               for d in docs)


def compose_mounts(service: dict) -> dict[str, str]:
    """target -> source of a compose service's short-syntax volumes."""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}


@pytest.mark.timeout(60)
def test_compose_etcd_serves_only_tls_and_every_litz_service_mounts_the_client_certificate() -> None:
    services = load_manifests()["docker-compose.yml"][0]["services"]
    etcd = services["etcd"]
    opts = flags(etcd["command"])
    assert opts["listen-client-urls"].startswith("https://") and opts["client-cert-auth"] == "true", opts
    assert opts["advertise-client-urls"].startswith("https://"), opts
    # the certificates are made by a one-shot service that etcd waits for, into volumes etcd and Litz mount
    (maker,) = [name for name, dep in etcd["depends_on"].items()
                if dep.get("condition") == "service_completed_successfully"]
    made = set(compose_mounts(services[maker]).values())
    for option in ("cert-file", "key-file", "trusted-ca-file"):
        assert compose_mounts(etcd).get(os.path.dirname(opts[option])) in made, (option, opts[option])
    health = flags(etcd["healthcheck"]["test"])
    assert health["endpoints"].startswith("https://") and all(health[o] for o in ("cacert", "cert", "key"))
    litz_services = 0
    for name, service in services.items():
        calls = [c for cmd, env, style in container_commands(service, style="compose")
                 for c in litz_calls(cmd, env, style)]
        for prog, words in calls:
            args = parsed(prog, words)
            for option, file in TLS_FILES.items():
                path = getattr(args, option)
                assert os.path.basename(path) == file, (name, option, path)
                assert compose_mounts(service).get(os.path.dirname(path)) in made, (name, option, path)
            assert service["depends_on"]["etcd"]["condition"] == "service_healthy", name
        litz_services += bool(calls)
    assert litz_services == 3


def names_clients_use() -> set[str]:
    """Every host that a deploy file's litz, litzctl or etcdctl (probes) connects to etcd by."""
    hosts = {endpoint.strip().rpartition(":")[0] for cs in manifest_calls().values() for prog, words in cs
             for endpoint in parsed(prog, words).etcd.split(",")}
    for name in os.listdir(K8S) + ["docker-compose.yml"]:
        path = os.path.join(K8S if name != "docker-compose.yml" else DEPLOY, name)
        if path.endswith((".yaml", ".yml")):
            with open(path) as f:
                hosts |= set(re.findall(r"--endpoints=https://([^:/\s\"',]+):", f.read()))
    return hosts


def openssl(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def subject_alt_names(cert: str) -> set[str]:
    text = openssl("x509", "-noout", "-text", "-in", cert).stdout
    line = text.split("X509v3 Subject Alternative Name:", 1)[1].strip().splitlines()[0]
    names = set()
    for entry in line.split(","):
        kind, _, value = entry.strip().partition(":")
        names.add(str(ipaddress.ip_address(value)) if kind == "IP Address" else value)
    return names


def make_certs(directory, *names: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", MAKE_CERTS, str(directory), *names], capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(150)
def test_make_etcd_certs_makes_a_ca_and_certificates_for_the_names_the_deploy_files_use(tmp_path) -> None:
    certs = tmp_path / "certs"
    res = make_certs(certs, "node07", "10.1.2.3")  # as litz.sbatch passes the head node's name or address
    assert res.returncode == 0, res.stderr
    files = {"ca.crt", "ca.key", "server.crt", "server.key", "client.crt", "client.key"}
    assert set(os.listdir(certs)) == files
    assert all(os.stat(certs / f).st_mode & 0o077 == 0 for f in files)  # private to the user
    check = openssl("verify", "-CAfile", "ca.crt", "server.crt", "client.crt", cwd=certs)
    assert check.returncode == 0 and check.stdout.count(": OK") == 2, check.stdout + check.stderr

    sans = subject_alt_names(str(certs / "server.crt"))
    wanted = names_clients_use() | {"node07", "10.1.2.3", "127.0.0.1"}  # 127.0.0.1: local-cluster.sh
    assert {"etcd", "127.0.0.1"} <= wanted and wanted <= sans, (wanted, sans)
    usage = {who: openssl("x509", "-noout", "-text", "-in", f"{who}.crt", cwd=certs).stdout
             for who in ("ca", "server", "client")}
    assert "CA:TRUE" in usage["ca"] and "CA:FALSE" in usage["server"] and "CA:FALSE" in usage["client"]
    assert "TLS Web Client Authentication" in usage["client"] and "TLS Web Server" not in usage["client"]
    assert "TLS Web Server Authentication" in usage["server"]

    # kustomize's secretGenerator and the compose service read exactly files the script writes
    for secret in secret_generators().values():
        assert all(f.startswith("certs/") and f[len("certs/"):] in files for f in secret.values()), secret
    with open(os.path.join(DEPLOY, "docker-compose.yml")) as f:
        assert set(re.findall(r"/tmp/certs/(\w+\.\w+)", f.read())) <= files

    # it never overwrites certificates (a CA in use), and it refuses a name that is not one
    before = (certs / "ca.crt").read_bytes()
    again = make_certs(certs)
    assert again.returncode != 0 and "exists" in again.stderr and (certs / "ca.crt").read_bytes() == before
    bad = make_certs(tmp_path / "other", "etcd,DNS:evil")
    assert bad.returncode == 2 and not (tmp_path / "other").exists()


@pytest.mark.timeout(150)
def test_etcd_with_these_certificates_accepts_litz_with_the_client_certificate_only(tmp_path) -> None:
    """What every deploy file relies on, against a real etcd: the script's certificates work for etcd
    (--client-cert-auth) and for Litz's client, by a DNS name and by an address in the certificate."""
    if not shutil.which("etcd"):
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    certs = tmp_path / "certs"
    assert make_certs(certs).returncode == 0

    tls = ["--etcd-cacert", str(certs / "ca.crt"), "--etcd-cert", str(certs / "client.crt"),
           "--etcd-key", str(certs / "client.key")]
    server = start_one(tmp_path, "tls", tls=(str(certs / "server.crt"), str(certs / "server.key"),
                                             str(certs / "ca.crt")))
    client = server.client
    try:
        # litzctl waits for etcd (--etcd-timeout), as the scripts and the init containers rely on
        res = run_cli(["litzctl", "--etcd", f"localhost:{client}", *tls, "--etcd-timeout", "30", "list"], timeout=60)
        assert res.returncode == 0 and "no running jobs" in res.stdout, res.stderr
        # the CA alone (TLS, but no client certificate) is not enough
        res = run_cli(["litzctl", "--etcd", f"127.0.0.1:{client}", *tls[:2], "--etcd-timeout", "2", "list"],
                      timeout=60)
        assert res.returncode == 2 and "unreachable" in res.stderr, res.stderr
    finally:
        server.kill()
