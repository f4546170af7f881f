"""The SCAR rework simulation behind bench/scar_rework.py (thesis §5.5.3-5.5.4): its rework accounting and
its running checkpoint, on a problem small enough to take well under a second."""
import numpy as np
import pytest

from tests.support.bench import bench_module

sr = bench_module("scar_rework")

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 16)) * np.linspace(0.1, 2.0, 16)  # features of very different scales
    y = np.argmax(X @ rng.standard_normal((16, 4)), axis=1)  # learnable labels: the loss keeps falling
    return sr.Problem("tiny", X, y, lr=0.3, about="tiny")


def test_threshold_grid_costs_rollbacks_exactly_and_small_perturbations_less_than_an_iteration(problem):
    traj, losses = problem.trajectory(sr.K0)
    thresholds = sr.threshold_grid(losses)
    assert (np.diff(thresholds) < 0).all() and len(thresholds) == sr.POSITIONS + 1
    assert thresholds[0] < losses[sr.K0 - 1] and thresholds[-1] >= losses[sr.K0]
    steps = problem.steps_to(np.array([traj[0], traj[sr.K0 - 5], traj[sr.K0]]), thresholds)
    assert (steps[0] == sr.K0).all()  # fault-free: every threshold after exactly K0 iterations
    assert (steps[1] == 5).all()  # rolled back by 5 iterations: 5 more, whatever the threshold
    assert (steps[2, :-1] == 0).all()  # already there
    # a tiny perturbation away from the optimum costs a whole iteration at the zero-slack threshold only
    nudged = traj[sr.K0] - 0.2 * (traj[sr.K0] - traj[sr.K0 - 1])
    s = problem.steps_to(nudged[None], thresholds)[0]
    assert s[-1] == 1 and 0 < s[:-1].mean() < 0.5


def test_running_checkpoint_priority_saves_the_rows_that_moved_most(problem):
    traj, _ = problem.trajectory(sr.K0)
    d = problem.d
    r = 0.125
    period = max(1, round(r * sr.C))  # C = 8: every iteration
    trial = sr.Trial(T=period + 1, partition=np.arange(d).reshape(sr.SERVERS, d // sr.SERVERS),
                     order=np.arange(sr.SERVERS))
    rng = np.random.default_rng(0)
    # one save, after iteration `period`, of 1/8 of the weights (values) that moved farthest; the rest stay at W0
    saved = sr.running_checkpoint(traj, trial, r, "priority", rng)
    moved = np.abs(traj[period] - traj[0]).ravel()
    top = set(np.argsort(-moved)[:round(r * moved.size)].tolist())
    changed = set(np.nonzero((saved != traj[0]).ravel())[0].tolist())
    assert changed == top
    assert (saved.ravel()[sorted(top)] == traj[period].ravel()[sorted(top)]).all()
    assert len({q // problem.k for q in top}) > 2, "values of more rows than a 1/8 of whole rows would reach"
    # whole rows (keys), as Litz picked before: the 2 of the 16 rows that moved farthest
    by_key = sr.running_checkpoint(traj, trial, r, "priority-key", rng)
    rows_moved = np.linalg.norm(traj[period] - traj[0], axis=1)
    changed = {q for q in range(d) if not np.array_equal(by_key[q], traj[0][q])}
    assert changed == set(np.argsort(-rows_moved)[:2].tolist())
    # round-robin covers every row once per 1/r saves
    trial.T = 8 * period + 1
    rr = sr.running_checkpoint(traj, trial, r, "round", rng)
    assert all(not np.array_equal(rr[q], traj[0][q]) for q in range(d))


def test_an_iteration_is_one_pass_in_mini_batches(problem):
    """MNIST's iteration (the thesis' batches of 10,000 of 60,000 images): one pass over the data in a fixed
    split and order of mini-batch steps, with the loss over all the data before it; a fixed map, so a rollback
    by 5 iterations costs exactly 5 and the fault-free run reaches every threshold after exactly K0."""
    mb = sr.Problem("tiny-mb", problem.X, problem.y, lr=0.3, about="tiny", batches=4)
    assert sorted(np.concatenate(mb.split).tolist()) == list(range(len(problem.X)))  # each row once a pass
    W = np.zeros((1, mb.d, mb.k), sr.DTYPE)
    loss, after = mb.iterate(W)
    by_hand = W.copy()
    for rows in mb.split:  # a step of 0.3 on the mean loss of each batch, in turn
        X, y = problem.X[rows], problem.y[rows]
        P = np.exp(X @ by_hand[0]) / np.exp(X @ by_hand[0]).sum(axis=1, keepdims=True)
        by_hand = by_hand - 0.3 * (X.T @ (P - np.eye(mb.k)[y]) / len(rows))[None]
    assert np.allclose(after, by_hand, atol=1e-6) and not np.allclose(after, W - 0.3 * mb.loss_grad(W)[1])
    assert np.isclose(loss[0], mb.loss_grad(W)[0][0])
    traj, losses = mb.trajectory(sr.K0)
    thresholds = sr.threshold_grid(losses)
    steps = mb.steps_to(np.array([traj[0], traj[sr.K0 - 5]]), thresholds)
    assert (steps[0] == sr.K0).all() and (steps[1] == 5).all()


def test_failure_convention_follows_the_thesis(problem):
    """Thesis §5.4.1: a checkpoint taken after iteration C is in place for a failure during iteration T > C, so
    full recovery loses T - 1 - C iterations (none right after a save); ``before-save`` keeps one more."""
    traj, _ = problem.trajectory(sr.K0)
    d, C = problem.d, sr.C
    part = np.arange(d).reshape(sr.SERVERS, d // sr.SERVERS)
    trials = [sr.Trial(T=C + 1, partition=part, order=np.arange(sr.SERVERS)),
              sr.Trial(T=C, partition=part, order=np.arange(sr.SERVERS))]
    assert [sr.progress(t.T, "thesis") - sr.last_save(t.T, C) for t in trials] == [0, C - 1]
    assert [sr.progress(t.T, "before-save") - sr.last_save(t.T, C) for t in trials] == [1, C]
    starts = sr.start_states(traj, trials, seed=0)
    thesis, late = starts["thesis"], starts["before-save"]
    # right after the save: full and partial recovery restore exactly the state at the failure
    assert np.array_equal(thesis["full"][0], traj[C]) and np.array_equal(thesis["partial 1/2"][0], traj[C])
    assert np.array_equal(late["full"][0], traj[C]) and not np.array_equal(late["partial 1/2"][0], traj[C + 1])
    # the rows that survive keep the progress made before the failure; the lost half comes from the checkpoint
    lost = sr.lost_rows(trials[1], 0.5)
    kept = np.setdiff1d(np.arange(d), lost)
    assert np.array_equal(thesis["partial 1/2"][1][kept], traj[C - 1][kept])
    assert np.array_equal(thesis["partial 1/2"][1][lost], traj[0][lost])
    assert np.array_equal(late["priority 1/8"][1][kept], traj[C][kept])
    assert np.array_equal(late["priority 1/8"][1][lost], thesis["priority 1/8"][1][lost])  # the same saves
