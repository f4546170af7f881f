"""A cluster job against an etcd secured as real deployments secure it: TLS with client certificates, and
users with passwords and a role limited to Litz's keys. Real etcd, real certificates (openssl)."""
import json
import subprocess
import sys

import pytest

from tests.support.chains import CHAINS, check_result
from tests.support.errors import assert_one_line
from tests.support.etcd import start_one
from tests.support.processes import Processes, app_path, run_cli, wait_for

STEPS = 150


def openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(d) -> dict:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=litz-test-ca", cwd=d)
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr",
                "-subj", f"/CN=litz-{who}", cwd=d)
        openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{who}.crt", "-days", "2", "-extfile", "san.cnf", cwd=d)
    return {k: str(d / f) for k, f in (("ca", "ca.crt"), ("cert", "client.crt"), ("key", "client.key"),
                                        ("server_cert", "server.crt"), ("server_key", "server.key"))}


ENABLE_AUTH = """
import sys
from pyetcd.client import Endpoint, MultiEndpointEtcd3Client
from pyetcd.etcdrpc import auth_pb2 as auth
from pyetcd.etcdrpc import rpc_pb2 as rpc

endpoint, ca, key, cert, password = sys.argv[1:]
creds = MultiEndpointEtcd3Client.get_secure_creds(ca, key, cert)
host, port = endpoint.rsplit(":", 1)
client = MultiEndpointEtcd3Client(endpoints=[Endpoint(host, int(port), secure=True, creds=creds)], timeout=5)
a = client.authstub
a.RoleAdd(rpc.AuthRoleAddRequest(name="root"), 5)
a.UserAdd(rpc.AuthUserAddRequest(name="root", password="root-" + password), 5)
a.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"), 5)
a.RoleAdd(rpc.AuthRoleAddRequest(name="litz"), 5)
a.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(
    name="litz", perm=auth.Permission(permType=auth.Permission.READWRITE, key=b"litz/", range_end=b"litz0")), 5)
a.UserAdd(rpc.AuthUserAddRequest(name="litz", password=password), 5)
a.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="litz", role="litz"), 5)
a.AuthEnable(rpc.AuthEnableRequest(), 5)
client.close()
"""


def enable_auth(endpoint: str, tls: dict, password: str) -> None:
    """root (needed to turn auth on) and a user 'litz' that may only read and write keys under 'litz/'. In a
    process of its own: a TLS gRPC channel leaves threads behind in the pytest process, and later tests
    launch jobs from it (a launcher with threads gets a fresh fork server, see litz.forkserver)."""
    subprocess.run([sys.executable, "-c", ENABLE_AUTH, endpoint, tls["ca"], tls["key"], tls["cert"], password],
                   check=True, timeout=60)


@pytest.fixture
def secure_etcd(tmp_path):
    tls = make_certificates(tmp_path)

    server = start_one(tmp_path, "secure", tls=(tls["server_cert"], tls["server_key"], tls["ca"]),
                       extra=("--auth-token-ttl", "1"))  # tokens expire during the job
    try:
        wait_for(lambda: subprocess.run(["openssl", "s_client", "-connect", server.endpoint, "-CAfile", tls["ca"],
                                         "-cert", tls["cert"], "-key", tls["key"]], input=b"", capture_output=True,
                                        timeout=10).returncode == 0, 20, "etcd serving TLS")
        password = "s3cret-etcd-password"
        enable_auth(server.endpoint, tls, password)
        (tmp_path / "etcd.password").write_text(password + "\n")
        yield server, tls, str(tmp_path / "etcd.password")
    finally:
        server.kill()


@pytest.mark.timeout(150)
def test_a_cluster_job_over_tls_with_a_user_limited_to_litz_keys(secure_etcd, tmp_path):
    server, tls, password_file = secure_etcd
    secure = ["--etcd", server.endpoint, "--etcd-cacert", tls["ca"], "--etcd-cert", tls["cert"], "--etcd-key",
              tls["key"], "--etcd-user", "litz", "--etcd-password-file", password_file]
    name, out = "secure-job", tmp_path / "out.json"
    with Processes() as procs:
        master = procs.start(["litz", "master", app_path("chains"), *secure, "--name", name, "--min-workers", "2",
                              "--executors", "8", "--config", f"chains={CHAINS}", f"steps={STEPS}", "sleep=0.002",
                              "--no-progress", "--output", str(out)])
        for kind in ("worker", "worker", "server"):
            procs.start(["litz", kind, *secure, "--name", name])

        def running():
            res = run_cli(["litzctl", *secure, "--name", name, "status", "--json"], timeout=30)
            return res.returncode == 0 and json.loads(res.stdout)

        wait_for(running, 60, "status through the secured etcd")
        stdout, stderr = master.communicate(timeout=120)
        assert master.returncode == 0, stderr
    check_result(json.loads(stdout), steps=STEPS)


@pytest.mark.timeout(90)
def test_wrong_credentials_and_plain_connections_are_one_line_errors(secure_etcd, tmp_path):
    server, tls, password_file = secure_etcd
    tls_args = ["--etcd", server.endpoint, "--etcd-cacert", tls["ca"], "--etcd-cert", tls["cert"], "--etcd-key",
                tls["key"]]
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-it\n")
    res = run_cli(["litzctl", *tls_args, "--etcd-user", "litz", "--etcd-password-file", str(wrong), "list"],
                  timeout=30)
    assert_one_line(res, "authentication failed")

    # without TLS the server is unreachable: said in one line, after --etcd-timeout
    assert_one_line(run_cli(["litzctl", "--etcd", server.endpoint, "--etcd-timeout", "2", "list"], timeout=30),
                    "unreachable since")

    # TLS but no user, where etcd requires one: reading the registry is refused, in one line
    assert_one_line(run_cli(["litzctl", *tls_args, "list"], timeout=30))

    res = run_cli(["litzctl", *tls_args[:2], "--etcd-cert", tls["cert"], "list"], timeout=30)
    assert res.returncode == 2 and "--etcd-cert and --etcd-key go together" in res.stderr, res.stderr
