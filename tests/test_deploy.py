"""The deploy files' command lines are ones the real ``litz`` / ``litzctl`` parsers accept.

Docker and Kubernetes are not available on this machine, so the manifests cannot run here; what can rot
silently is the Litz side of them: a renamed flag, a missing argument. Every ``litz``/``litzctl`` invocation
in the compose file, the Kubernetes manifests (containers, init containers, preStop hooks) and the shell
scripts is extracted and parsed by the CLI's own argparse parser.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess

import pytest
import yaml

from litz.cli import litz as litz_cli
from litz.cli import litzctl as litzctl_cli

DEPLOY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy")
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


def container_commands(doc) -> list[list[str]]:
    """Every command (command + args) in a compose file or a Kubernetes object, preStop hooks included."""
    found = []
    if isinstance(doc, dict):
        if "command" in doc and isinstance(doc["command"], list):
            found.append([str(w) for w in doc["command"] + doc.get("args", [])])
        elif "command" in doc and isinstance(doc["command"], str):
            found.append(["sh", "-c", doc["command"]])
        for value in doc.values():
            found.extend(container_commands(value))
    elif isinstance(doc, list):
        for value in doc:
            found.extend(container_commands(value))
    return found


def litz_calls(command: list[str]) -> list[tuple[str, list[str]]]:
    if command[:2] == ["sh", "-c"]:
        return invocations(command[2])
    if command and command[0] in PARSERS:
        return [(command[0], shlex.split(expand(shlex.join(command[1:]))))]
    return []


def manifest_calls() -> dict[str, list[tuple[str, list[str]]]]:
    calls = {}
    paths = [os.path.join(DEPLOY, "docker-compose.yml")]
    k8s = os.path.join(DEPLOY, "kubernetes")
    paths += [os.path.join(k8s, f) for f in sorted(os.listdir(k8s)) if f.endswith(".yaml")]
    for path in paths:
        with open(path) as f:
            docs = list(yaml.safe_load_all(f))
        commands = [cmd for d in docs for cmd in container_commands(d)]
        calls[os.path.relpath(path, DEPLOY)] = [c for cmd in commands for c in litz_calls(cmd)]
    return calls


def script_calls() -> dict[str, list[tuple[str, list[str]]]]:
    calls = {}
    for name in ("slurm/litz.sbatch", "local-cluster.sh"):
        with open(os.path.join(DEPLOY, name)) as f:
            text = "\n".join(line for line in f.read().splitlines() if not line.lstrip().startswith(("#", "echo")))
        calls[name] = invocations(text)
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
