"""End-to-end through real processes: the consistency rule and exact update totals."""
import pytest

import litz
from tests.apps.chains import SHAPE
from tests.support.chains import check_result
from tests.support.processes import app_path, metric_rows


@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers,servers,executors,shards,shape", [
    (2, 1, 8, 0, SHAPE), (3, 3, 12, 257, SHAPE),
    (2, 2, 8, 0, (256, 128)),  # 128-256 KiB arrays: updates and gets go through shared-memory rings
])
def test_causal_chains_and_concurrent_updates(workers, servers, executors, shards, shape):
    chains, steps = 24, 30
    result = litz.run(app_path("chains"), workers=workers, servers=servers, executors=executors,
                      shards=shards, config={"chains": chains, "steps": steps, "shape": list(shape)})
    check_result(result, steps=steps, chains=chains, shape=shape)


@pytest.mark.timeout(60)
def test_output_and_metrics_files(tmp_path):
    out, metrics = tmp_path / "out.json", tmp_path / "m.jsonl"
    result = litz.run(app_path("noop"), workers=2, servers=1, config={"tasks": 500},
                      output=str(out), metrics=str(metrics))
    assert result == {"done": 500}
    import json

    doc = json.loads(out.read_text())
    assert doc["result"] == {"done": 500} and doc["tasks_completed"] == 500
    assert doc["elapsed_s"] > 0 and isinstance(doc["events"], list)
    rows = metric_rows(metrics)
    assert len(rows) == 500 and rows[-1]["done"] == 500
    assert rows[-1]["workers"] == 2 and rows[-1]["servers"] == 1 and "t" in rows[0]
