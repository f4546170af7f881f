"""litzctl's requests are signed with the job secret: access to the registry alone does not steer a job.

The verifier on its own (every way a request can be forged or reused), then a cluster job on real etcd started
with --secret-file (its secret is nowhere in etcd): requests written straight into etcd, as anyone who can
reach it could, are refused with a warning and change nothing; litzctl without the secret fails in one line,
with --secret-file (or $LITZ_SECRET) it works."""
import json
import math
import os
import secrets
import time

import pytest

from litz import clock
from litz.control import MAX_AGE_S, NOT_SIGNED, RequestVerifier, sign_request
from litz.membership import Membership, connect_kv
from tests.support.chains import master_args, role
from tests.support.processes import Processes, ctl, run_cli, status, wait_for

SECRET, JOB, MASTER = "the-job-secret", "job", "m1"
FLOOD = 40


def verifier() -> RequestVerifier:
    return RequestVerifier(SECRET, JOB, MASTER)


def test_a_signed_request_passes_once():
    v = verifier()
    doc = json.loads(json.dumps(sign_request(SECRET, JOB, MASTER, "r1", "kill", {"id": "w0", "after": 0.5})))
    assert v.check("r1", doc) is None  # as it comes back from the registry (JSON)
    replay = v.check("r1", doc)
    assert replay.reason == "replayed" and not replay.forged and replay.answer is None  # r1 was answered already


@pytest.mark.parametrize("forgery", ["unsigned", "wrong key", "raw secret as key", "other job", "other id",
                                     "changed command", "changed args", "changed time", "not a dict", "sig not str",
                                     "NaN args", "bad id"])
def test_forgeries_are_refused_as_not_signed(forgery):
    rid, doc = "r1", sign_request(SECRET, JOB, MASTER, "r1", "scale", {"workers": 2})
    if forgery == "unsigned":
        doc = {"command": "stop", "args": {}, "t": clock.time()}
    elif forgery == "wrong key":
        doc = sign_request("not-the-secret", JOB, MASTER, rid, "stop", {})
    elif forgery == "raw secret as key":  # the MAC key is derived for this purpose, not the secret itself
        import hashlib
        import hmac

        from litz.control import _signed_bytes

        doc = {**doc, "sig": hmac.new(SECRET.encode(), _signed_bytes(JOB, MASTER, rid, "scale", {"workers": 2},
                                                                      doc["t"], doc["nonce"]), hashlib.sha256
                                      ).hexdigest()}
    elif forgery == "other job":  # the same secret file used for two jobs
        doc = sign_request(SECRET, "other-job", MASTER, rid, "stop", {})
    elif forgery == "other id":
        rid = "r2"
    elif forgery == "changed command":
        doc = {**doc, "command": "stop"}
    elif forgery == "changed args":
        doc = {**doc, "args": {"workers": 1}}
    elif forgery == "changed time":
        doc = {**doc, "t": doc["t"] + 1}
    elif forgery == "not a dict":
        doc = ["stop"]
    elif forgery == "sig not str":
        doc = {**doc, "sig": 12}
    elif forgery == "NaN args":
        doc = {**doc, "args": {"workers": math.nan}}
    elif forgery == "bad id":
        rid = "../status"
    refusal = verifier().check(rid, doc)
    assert refusal is not None and refusal.forged
    assert refusal.answer == (None if forgery == "bad id" else NOT_SIGNED)


def test_stale_future_and_other_master_requests_are_refused_with_the_reason():
    v, now = verifier(), clock.time()
    old = v.check("r1", sign_request(SECRET, JOB, MASTER, "r1", "stop", {}, t=now - MAX_AGE_S - 5))
    assert old.reason.startswith("stale") and "before the master's clock" in old.answer and not old.forged
    ahead = v.check("r2", sign_request(SECRET, JOB, MASTER, "r2", "stop", {}, t=now + MAX_AGE_S + 5))
    assert ahead.reason.startswith("stale") and "ahead of the master's clock" in ahead.answer
    earlier = v.check("r3", sign_request(SECRET, JOB, "m0", "r3", "stop", {}))
    assert "earlier master" in earlier.reason and not earlier.forged
    skewed = sign_request(SECRET, JOB, MASTER, "r4", "stop", {}, t=now - MAX_AGE_S / 2)  # clocks differ a little
    assert v.check("r4", skewed) is None


def test_nonces_are_forgotten_only_once_their_requests_are_stale(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(clock, "time", lambda: now[0])
    v = verifier()
    doc = sign_request(SECRET, JOB, MASTER, "r1", "stop", {})
    assert v.check("r1", doc) is None
    now[0] += MAX_AGE_S - 1
    assert v.check("r1", doc).reason == "replayed"
    assert v.check("r2", sign_request(SECRET, JOB, MASTER, "r2", "checkpoint", {})) is None  # prunes nothing yet
    now[0] += 2
    assert v.check("r1", doc).reason.startswith("stale")  # forgotten by now, and refused all the same
    assert doc["nonce"] not in v._seen and len(v._seen) == 1  # the memory holds what could still be replayed


# -- a real cluster job on etcd, its secret in a file --------------------------------------------------------
@pytest.mark.timeout(150)
def test_requests_forged_in_etcd_are_refused_and_litzctl_needs_the_secret_file(etcd, tmp_path):
    e, name, out = etcd.endpoint, "ctl-auth", tmp_path / "out.json"
    secret_file = tmp_path / "job.secret"
    secret_file.write_text(secrets.token_hex(32) + "\n")
    secret = secret_file.read_text().strip()
    key = ["--secret-file", str(secret_file)]
    with Processes() as procs:
        master = procs.start(master_args(e, name, "--min-workers", "1", "--output", str(out),
                                         "--checkpoint-dir", str(tmp_path / "ckpt"), *key))
        procs.start(role("worker", e, name, *key))
        procs.start(role("server", e, name, *key))
        wait_for(lambda: (s := status(name, e)) and s["tasks_completed"] > 0, 30, "the job running")
        job = Membership(connect_kv(e), name)
        assert job.get("secret") is None  # nowhere in etcd

        # litzctl without the secret: one line, nothing posted; status needs no secret
        res = ctl(name, "stop", etcd=e)
        assert res.returncode == 2 and res.stdout == "", res
        assert res.stderr.strip() == (f"litzctl: error: job {name!r} keeps its secret out of the registry (its "
                                      "master was given one): pass the same --secret-file, or set LITZ_SECRET")
        assert not job.kv.get_prefix(job.prefix + "requests/")
        wrong = tmp_path / "wrong.secret"
        wrong.write_text("not-the-job-secret")
        res = ctl(name, "--secret-file", str(wrong), "kill", "w0", etcd=e)
        assert res.returncode == 2 and res.stderr.strip() == f"litzctl: error: {NOT_SIGNED}", res.stderr

        # forgeries written straight into etcd, as anyone who can reach it could
        instance = job.master()["instance"]

        def answer(rid: str) -> dict | None:
            return job.kv.get(f"{job.prefix}responses/{rid}")

        def handled(rid: str) -> None:
            """Wait until the master has handled what was posted before: it takes requests oldest first, in one
            thread, so once a signed request posted now is answered, every earlier one was handled too."""
            marker = f"after-{rid}"
            job.kv.put(f"{job.prefix}requests/{marker}", sign_request(secret, name, instance, marker, "plot", {}))
            wait_for(lambda: answer(marker), 10, f"the master's answer to {marker}")

        def post(rid: str, doc, answered: bool = True) -> dict | None:
            job.kv.put(f"{job.prefix}requests/{rid}", doc)
            if answered:
                return wait_for(lambda: answer(rid), 10, f"the master's answer to {rid}")
            handled(rid)
            return answer(rid)

        now = time.time()
        assert post("unsigned", {"command": "stop", "args": {}, "t": now}) == {"ok": False, "message": NOT_SIGNED}
        assert post("wrongkey", sign_request("guess", name, instance, "wrongkey", "kill", {"id": "w0"})) == {
            "ok": False, "message": NOT_SIGNED}
        stale = post("stale", sign_request(secret, name, instance, "stale", "stop", {}, t=now - 3600))
        assert not stale["ok"] and "before the master's clock" in stale["message"]
        # a request signed with the secret, carried out once, then posted again as it was (the same id and nonce)
        signed = sign_request(secret, name, instance, "replayed", "checkpoint", {})
        assert post("replayed", signed)["ok"]
        wait_for(lambda: (s := status(name, e)) and s["checkpoints"] == 1, 30, "the checkpoint")
        job.kv.delete(f"{job.prefix}responses/replayed")
        assert post("replayed", signed, answered=False) is None  # refused, the answer under its id left alone
        for i in range(FLOOD):  # a flood: refused all the same, with a few warnings and a count
            job.kv.put(f"{job.prefix}requests/flood{i}", {"command": "stop", "args": {}, "t": now})
        wait_for(lambda: not job.kv.get_prefix(job.prefix + "requests/"), 30, "the flood taken")
        handled("flood")
        # a status published after the flood was handled: still one checkpoint, the job running with w0
        before = status(name, e)
        st = wait_for(lambda: (s := status(name, e)) and s["elapsed_s"] > before["elapsed_s"] and s, 10,
                      "a status published after the flood")
        assert st["checkpoints"] == 1 and st["state"] == "running" and [w["id"] for w in st["workers"]] == ["w0"]

        # with the secret, from the file or the environment, litzctl steers the job
        res = run_cli(["litzctl", "--etcd", e, "--name", name, "checkpoint"], timeout=60,
                      env={**os.environ, "LITZ_SECRET": secret})
        assert res.returncode == 0 and "checkpoint requested" in res.stdout, res.stderr
        wait_for(lambda: (s := status(name, e)) and s["checkpoints"] == 2, 30, "the second checkpoint")
        res = ctl(name, *key, "stop", etcd=e)
        assert res.returncode == 0, res.stderr
        stdout, stderr = master.communicate(timeout=60)
        assert master.returncode == 0, stderr
    assert json.loads(stdout) is None  # stopped by the signed request, not by a forged one
    refused = [ln for ln in stderr.splitlines() if ln.startswith("litz: warning: refused a '")]
    counted = [int(ln.split()[5]) for ln in stderr.splitlines() if ln.startswith("litz: warning: refused a request ")]
    assert counted and len(refused) + sum(counted) == 5 + FLOOD, stderr  # every refusal warned or counted
    assert len(refused) <= 10 and len(counted) <= 3, stderr  # a burst of 5 warnings per 10 s, then counts
    for what in ("'stop' request (id 'unsigned') from the registry: not signed;",
                 "'kill' request (id 'wrongkey') from the registry: bad signature: not the job secret's;",
                 "'stop' request (id 'stale') from the registry: stale: signed 36",
                 "'checkpoint' request (id 'replayed') from the registry: replayed;"):
        assert any(what in ln for ln in refused), (what, stderr)
    assert all(ln.endswith("; nothing was done") for ln in refused), stderr
    events = json.loads(out.read_text())["events"]
    assert [ev["kind"] for ev in events if ev["kind"] in ("recovery", "stop", "checkpoint")] == [
        "checkpoint", "checkpoint", "stop"]
