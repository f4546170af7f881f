"""stdout holds the job's result alone, so `litz run app > result.json` and `| jq` work: what the app prints goes
to stderr, each line named after the process and executor it came from."""
import json
import re
import subprocess
import sys

import pytest

from tests.support.badapps import write_app
from tests.support.processes import ROOT

PRINTER = """
import os

print("module imported")


class D(litz.Driver):
    def dispatch_initial_tasks(self):
        print("driver starts")
        for e in range(self.num_executors):
            self.dispatch_task(e, e)
        self.left = self.num_executors

    def handle_task_completion(self, r):
        self.left -= 1
        if not self.left:
            self.finish({"done": self.num_executors})


class E(litz.Executor):
    def load_input(self):
        print("loading", self.executor_id)

    def run_task(self, a):
        print("task", a, end="")
        self.ps_get("k")  # a fetch: other tasks run meanwhile, and the line is finished after it
        print(" done")
        os.write(1, b"written to descriptor 1\\n")  # C code and subprocesses write there
        return a
"""


def shell_run(args: list[str], tmp_path) -> tuple[str, str, int]:
    """`litz run ARGS > out.json 2> err.txt`, with real files as a shell would give."""
    out, err = tmp_path / "out.json", tmp_path / "err.txt"
    with open(out, "w") as o, open(err, "w") as e:
        code = subprocess.run([sys.executable, "-m", "litz.cli.litz", "run", *args], cwd=ROOT, stdout=o, stderr=e,
                              stdin=subprocess.DEVNULL, timeout=240).returncode
    return out.read_text(), err.read_text(), code


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_stdout_holds_only_the_result_and_app_prints_are_named_on_stderr(tmp_path, monkeypatch, spawn):
    monkeypatch.setenv("LITZ_SPAWN", spawn)
    app = write_app(tmp_path, "printer", PRINTER)
    out, err, code = shell_run([app, "--workers", "2", "--executors", "4", "--no-progress"], tmp_path)
    assert code == 0, err
    assert json.loads(out) == {"done": 4}
    lines = err.splitlines()
    assert "[driver] module imported" in lines and "[driver] driver starts" in lines
    for e in range(4):  # each executor's lines name it, and the worker it ran on
        tasks = [m for line in lines if (m := re.fullmatch(r"\[(w\d+) e(\d+)\] task (\d+) done", line))]
        loads = [m for line in lines if (m := re.fullmatch(r"\[(w\d+) e(\d+)\] loading (\d+)", line))]
        assert [m.group(2) for m in tasks if m.group(3) == str(e)] == [str(e)], err
        assert [m.group(2) for m in loads if m.group(3) == str(e)] == [str(e)], err
    assert err.count("written to descriptor 1") == 4


@pytest.mark.timeout(240)
def test_lda_prints_a_summary_and_keeps_the_whole_result_in_output(tmp_path):
    config = ["synthetic=1", "docs=400", "vocab=300", "topics=12", "epochs=3"]
    out, err, code = shell_run(["apps.lda", "--no-progress", "--config", *config], tmp_path)
    assert code == 0, err
    shown = json.loads(out)
    assert len(out) < 1500 and "history" not in shown and len(shown["top_words"]) == 4, out  # 3 topics and a note
    assert shown["epochs"] == 3 and shown["ll_per_token"] < 0
    assert "--output FILE keeps all of it" in err
    whole = tmp_path / "whole" / "result.json"  # its directory made for it
    out, err, code = shell_run(["apps.lda", "--no-progress", "--output", str(whole), "--config", *config], tmp_path)
    assert code == 0 and "keeps all of it" not in err, err
    result = json.loads(whole.read_text())["result"]
    assert len(result["history"]) == 3 and len(result["top_words"]) == 12
    assert json.loads(out)["top_words"][:3] == [words[:8] for words in result["top_words"][:3]]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("app,config", [("apps.mlr", ["synthetic=1", "epochs=1", "n=4000", "n_test=1000"]),
                                        ("apps.kmeans", ["synthetic=1", "n=4000", "epochs=1"]),
                                        ("apps.hdbscan", ["synthetic=1", "n=3000"])])
def test_the_other_bundled_apps_print_short_results(tmp_path, app, config):
    out, err, code = shell_run([app, "--no-progress", "--config", *config], tmp_path)
    assert code == 0, err
    assert isinstance(json.loads(out), dict) and len(out) < 1500, out


@pytest.mark.timeout(60)
def test_an_output_directory_that_cannot_be_made_fails_before_the_job(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out, err, code = shell_run(["apps.mlr", "--no-progress", "--output", str(blocker / "r.json"), "--config",
                                "synthetic=1"], tmp_path)
    assert code == 2 and out == "", err
    assert err.splitlines() == [f"litz: error: --output {blocker}/r.json: cannot create the directory {blocker} "
                                "(File exists)"], err


def test_a_model_path_that_cannot_be_written_is_one_config_error(tmp_path):
    """`--config output=` follows the rule of --output and --metrics (joblog.make_parent): the directory is made at
    the start, and a path that cannot be written is one error naming the key, before any training."""
    from apps.modelfile import model_path
    from litz.appconfig import ConfigError

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"^config 'output' .*: cannot create the directory .*a-file/sub"):
        model_path(str(blocker / "sub" / "m.npz"))
    with pytest.raises(ConfigError, match="is a directory"):
        model_path(str(tmp_path))
    assert model_path(str(tmp_path / "new" / "m.npz")) == str(tmp_path / "new" / "m.npz")
    assert (tmp_path / "new").is_dir()
