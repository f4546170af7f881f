"""Over-partitioning overhead for LDA (paper Fig. 4.2): epoch time with 1, 2, 4, 8 and 16 executors per worker.

Every run trains ``apps.lda`` on the same synthetic corpus (320 000 documents, about 57.6M tokens, vocabulary
5 000, K = 50; quick: 4 000 documents, vocabulary 2 000, K = 20) with 2 workers and 1 server; only
``executors`` changes (2, 4, 8, 16, 32), with the app's default settings: on this corpus one vocabulary block
per executor (every executor visits every block once per epoch: an epoch is E rounds of E tasks).

**Corpus size: the paper's data per worker.** The paper's Fig. 4.2 ran LDA on 10B tokens on 12 machines of 16
cores: 26-52M tokens per worker thread (one per hardware thread or per core). The main corpus gives each of the
2 workers 28.8M tokens, at the low end of that range. Every task costs the runtime about 0.12 ms of CPU on this
2-core machine, whatever its size (worker, server, master and their ZeroMQ threads share the two cores;
bench/README.md has the traces and profiles), and 16 executors per worker make 1 024 tasks an epoch instead of
4, so the ratio depends on how much sampling a task holds. Two smaller corpora show that dependence, measured
at 1 and 16 per worker: 14.4M tokens (``--mid-repeats``; 4x less data per worker than the paper's low end)
and 3.6M tokens (``--small-repeats``, ``lda_vs_tomotopy``'s corpus), each as its own row in the table, also at
the app's default settings: there one block per executor would leave a task 14k and 3.5k tokens, under the
app's ``TASK_TOKENS`` (40 000), so the default takes one block per worker (2: apps/lda/README.md, *Blocks*), and
sends rounds ahead since executors then take turns on a block. The 3.6M row's target is 1.25x.
The epoch time is the driver's per-epoch sampling time
(``history[i].seconds``: from the end of one epoch to the end of the next, the log-likelihood included)
averaged over epochs 3..N (the first epochs, with random topics, cost differently from the rest), the
same epochs at every count. ``elapsed_s`` (start to finish) is recorded too.

Runs are interleaved over the counts ``--repeats`` times (default 4). **The ratio is paired**: this machine's
speed drifts by more than the effect measured (the same code gave 1.08x to 1.26x on different days, and one
setting 2.0 then 2.13 s an epoch four minutes apart), so each round runs 1 and 16 per worker back to back, in
the order 1, 16, 2, 4, 8 and the next round reversed (8, 4, 2, 16, 1: a linear drift cancels over two
rounds), and the headline ratio is the median over rounds of that round's 16/1 ratio. The ratio of the
median epoch times is recorded beside it (``ratio_of_medians``); the table shows both.
Target: 16 executors/worker <= 1.10x the epoch time of 1 executor/worker (paper: 1.23x).

**Other blocks** (``--small-blocks``, default 32: one per executor, the default before the task-size rule): on
the 3.6M-token corpus every round also runs 16 per worker with ``blocks`` set to each of these (an epoch is
``blocks`` rounds; with fewer blocks than executors they take turns on each block: 32 x ``blocks`` tasks of about
3.6M / (32 x ``blocks``) tokens), paired with 1 per worker in the same round: the row
``lda_overpartition (3.6M tokens, blocks=B)``.

``--ahead default|0|1|both`` sets ``apps.lda``'s ``ahead`` (default: unset, the app's choice); ``both`` runs every
setting with ahead=0 and ahead=1 back to back and adds, per corpus, ahead=1's epoch times, its 16/1 ratio and
its paired ratio to ahead=0 per count (``summary.ahead``); the table's rows stay the first mode's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import _table
import lda_vs_tomotopy as lvt

import litz

PER_WORKER = (1, 2, 4, 8, 16)
WORKERS = 2
FULL = {"synthetic": 1, "docs": 320_000, "vocab": 5_000, "topics": 50, "doc_length": 180, "alpha": 0.1,
        "beta": 0.01, "seed": 0}
MID = {**FULL, "docs": 80_000}  # 14.4M tokens: about 14k tokens a task at 16/worker
SMALL = {**FULL, "docs": 20_000}  # the issue's corpus (lda_vs_tomotopy)
QUICK = {"synthetic": 1, "docs": 4_000, "vocab": 2_000, "topics": 20, "doc_length": 100, "alpha": 0.1,
         "beta": 0.01, "seed": 0}


def run_lda(executors: int, config: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="litz-bench-") as tmp:
        out = os.path.join(tmp, "out.json")
        result = litz.run("apps.lda", workers=WORKERS, servers=1, executors=executors, config=config,
                          name=f"bench-lda-overpartition-{os.getpid()}", output=out, progress=False)
        with open(out) as f:
            doc = json.load(f)
    seconds = [h["seconds"] for h in result["history"]]
    steady = seconds[2:] or seconds
    return {"executors": executors, "epoch_s": sum(steady) / len(steady), "elapsed_s": doc["elapsed_s"],
            "tasks": doc["tasks_completed"], "ll_per_token": result["ll_per_token"], "blocks": result["blocks"],
            "ahead": bool(result["schedule"].get("ahead")),
            "tokens_per_s": result["tokens_per_s"], "compute_s": result["compute_s"],
            "epoch_times": [round(s, 4) for s in seconds]}


def _round_order(counts: tuple, round_index: int) -> list:
    """1 and 16 per worker back to back, then the rest; every second round reversed (drift cancels)."""
    order = [1, 16] + [k for k in counts if k not in (1, 16)]
    return order if round_index % 2 == 0 else order[::-1]


def _round_ratios(runs: list, baseline: list) -> list[float]:
    """Each round's epoch time over the baseline's in the same round."""
    return [a["epoch_s"] / b["epoch_s"] for a, b in zip(runs, baseline, strict=True)]


def _tokens(config: dict) -> str:
    return f"{config['docs'] * config['doc_length'] / 1e6:.1f}M tokens"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/lda_overpartition.quick.json)")
    ap.add_argument("--repeats", type=int, help="rounds over all counts (default 4, quick 1)")
    ap.add_argument("--epochs", type=int, help="epochs per run (default 12, quick 5)")
    ap.add_argument("--docs", type=int, help="documents in the main corpus (default 320 000)")
    ap.add_argument("--main-repeats", type=int, default=None,
                    help="rounds of the main corpus over every count (default: --repeats; 0 skips)")
    ap.add_argument("--small-repeats", type=int, default=None,
                    help="rounds of the 3.6M-token corpus at 1 and 16 per worker (default: --repeats; 0 skips)")
    ap.add_argument("--mid-repeats", type=int, default=None,
                    help="rounds of the 14.4M-token corpus at 1 and 16 per worker (default: --repeats; 0 skips)")
    ap.add_argument("--small-blocks", default="32",
                    help="blocks settings also run at 16 per worker on the 3.6M-token corpus (comma-separated; "
                         "'' skips; default 32: one per executor)")
    ap.add_argument("--ahead", choices=("default", "0", "1", "both"), default="default",
                    help="apps.lda's ahead config: default (unset: the app's choice, ahead when blocks < executors), "
                         "0, 1, or both (each run with 0 and with 1, back to back)")
    args = ap.parse_args()
    modes = [None] if args.ahead == "default" else list(lvt.ahead_modes(args.ahead).values())  # [0], [1], [0, 1]
    config_of = {a: {} if a is None else {"ahead": a} for a in modes}
    repeats = args.repeats or (1 if args.quick else 4)
    epochs = args.epochs or (5 if args.quick else 12)
    config = {**(QUICK if args.quick else FULL), "epochs": epochs}
    if args.docs:
        config["docs"] = args.docs
    extra_corpora = {  # name -> (config, rounds): measured at 1 and 16 per worker only
        "mid_corpus": ({**MID, "epochs": epochs}, args.mid_repeats),
        "small_corpus": ({**SMALL, "epochs": epochs}, args.small_repeats)}
    extra_corpora = {name: (cfg, 0 if args.quick else (repeats if n is None else n))
                     for name, (cfg, n) in extra_corpora.items()}

    runs: dict[int, list] = {k: [] for k in PER_WORKER}
    ahead_runs: dict[int, list] = {k: [] for k in PER_WORKER}  # --ahead both: the ahead=1 run beside each
    main_rounds = repeats if args.main_repeats is None else args.main_repeats
    for i in range(main_rounds):
        for k in _round_order(PER_WORKER, i):
            for a in (modes if i % 2 == 0 else modes[::-1]):
                r = run_lda(k * WORKERS, {**config, **config_of[a]})
                (ahead_runs if a and len(modes) == 2 else runs)[k].append(r)
                print(f"round {i + 1}/{repeats} {k:2d}/worker ahead={a}: epoch {r['epoch_s'] * 1e3:7.1f} ms, "
                      f"elapsed {r['elapsed_s']:.2f} s, {r['tasks']} tasks, LL/token {r['ll_per_token']:.4f}",
                      flush=True)

    small_blocks = [int(b) for b in args.small_blocks.split(",") if b.strip()]
    blocks_runs: dict[tuple, list] = {(b, a): [] for b in small_blocks for a in modes}  # 16/worker, blocks=b, ahead=a
    extra: dict[str, dict[int, list]] = {name: {1: [], 16: []} for name in extra_corpora}
    extra_ahead: dict[str, dict[int, list]] = {name: {1: [], 16: []} for name in extra_corpora}
    for name, (cfg, rounds) in extra_corpora.items():
        for i in range(rounds):
            for k in _round_order((1, 16), i):
                for a in (modes if i % 2 == 0 else modes[::-1]):
                    r = run_lda(k * WORKERS, {**cfg, **config_of[a]})
                    (extra_ahead if a and len(modes) == 2 else extra)[name][k].append(r)
                    print(f"{_tokens(cfg)}, round {i + 1}/{rounds} {k:2d}/worker ahead={a}: "
                          f"epoch {r['epoch_s'] * 1e3:7.1f} ms, {r['tasks']} tasks", flush=True)
                if k == 16 and name == "small_corpus":  # beside 16/worker, with fewer blocks
                    settings = list(blocks_runs)
                    for b, a in (settings if i % 2 == 0 else settings[::-1]):
                        r = run_lda(16 * WORKERS, {**cfg, **config_of[a], "blocks": b})
                        blocks_runs[(b, a)].append(r)
                        print(f"{_tokens(cfg)}, round {i + 1}/{rounds} 16/worker blocks={b} ahead={a}: "
                              f"epoch {r['epoch_s'] * 1e3:7.1f} ms, {r['tasks']} tasks", flush=True)

    summary: dict = {}
    if main_rounds:
        med = {k: statistics.median(r["epoch_s"] for r in runs[k]) for k in PER_WORKER}
        rel = {k: statistics.median(_round_ratios(runs[k], runs[1])) for k in PER_WORKER}
        of_medians = {k: med[k] / med[1] for k in PER_WORKER}
        met = rel[16] <= 1.10
        summary = {"epoch_s": med, "relative_to_1": rel, "ratio_of_medians": of_medians, "met": met,
                   "round_ratios_16": [round(x, 4) for x in _round_ratios(runs[16], runs[1])],
                   "elapsed_s": {k: statistics.median(r["elapsed_s"] for r in runs[k]) for k in PER_WORKER},
                   "ll_per_token": {k: statistics.median(r["ll_per_token"] for r in runs[k]) for k in PER_WORKER},
                   "tasks": {k: runs[k][0]["tasks"] for k in PER_WORKER},
                   # an epoch is B rounds (B blocks): the time per round bounds the handoff latency
                   "ms_per_round": {k: 1e3 * med[k] / runs[k][0]["blocks"] for k in PER_WORKER}}
    for name, (cfg, rounds) in extra_corpora.items():
        if rounds:
            em = {k: statistics.median(r["epoch_s"] for r in extra[name][k]) for k in (1, 16)}
            paired = _round_ratios(extra[name][16], extra[name][1])
            summary[name] = {"config": cfg, "epoch_s": em, "ratio_16_vs_1": statistics.median(paired),
                             "round_ratios": [round(x, 4) for x in paired], "ratio_of_medians": em[16] / em[1],
                             "ms_per_round": {k: 1e3 * em[k] / extra[name][k][0]["blocks"] for k in em},
                             "runs": extra[name]}
            if name == "small_corpus" and rounds:
                summary[name]["blocks"] = {}  # against 1/worker at ahead=modes[0] (the default: unset)
                for (b, a), got in blocks_runs.items():
                    paired = _round_ratios(got, extra[name][1])
                    summary[name]["blocks"][f"{b},{a}"] = {
                        "blocks": b, "ahead": a, "epoch_s": statistics.median(r["epoch_s"] for r in got),
                        "ratio_16_vs_1": statistics.median(paired), "round_ratios": [round(x, 4) for x in paired],
                        "ll_per_token": statistics.median(r["ll_per_token"] for r in got), "runs": got}
    if len(modes) == 2:  # the same figures with ahead=1, and its paired ratio to ahead=0 per count
        sets = {**({"main": (ahead_runs, runs, PER_WORKER)} if main_rounds else {}),
                **{name: (extra_ahead[name], extra[name], (1, 16))
                   for name, (_, rounds) in extra_corpora.items() if rounds}}
        summary["ahead"] = {}
        for name, (ah, base, counts) in sets.items():
            em = {k: statistics.median(r["epoch_s"] for r in ah[k]) for k in counts}
            vs = {k: statistics.median(_round_ratios(ah[k], base[k])) for k in counts}
            r16 = statistics.median(_round_ratios(ah[16], ah[1]))
            summary["ahead"][name] = {"epoch_s": em, "ratio_16_vs_1": r16, "ahead_vs_not": vs, "runs": ah}
            print(f"ahead=1, {name}: epoch ms " + ", ".join(f"{k}/w {em[k] * 1e3:.0f}" for k in counts)
                  + f"; 16 vs 1: {r16:.2f}x paired; ahead=1 / ahead=0 per count: "
                  + ", ".join(f"{k}/w {vs[k]:.3f}x" for k in counts))
    doc = {"target": "LDA epoch time with 16 executors/worker <= 1.10x that with 1/worker (paper 1.23x)",
           "workers": WORKERS, "servers": 1, "config": config, "met": summary.get("met"), "summary": summary,
           "runs": runs,
           "ahead": modes if len(modes) == 2 else modes[0]}
    # without the main corpus (--main-repeats 0) the file is another: the main corpus's record stays
    path = _table.write_result("lda_overpartition" if main_rounds else "lda_overpartition.extra", doc,
                               quick=args.quick)
    rows = {}
    if main_rounds:
        line = ", ".join(f"{k}: {med[k] * 1e3:.0f}" for k in PER_WORKER)
        print(f"epoch ms per executors/worker {line}; 16 vs 1: {rel[16]:.2f}x paired, {of_medians[16]:.2f}x of "
              f"medians (target <= 1.10x: {'met' if met else 'MISSED'})")
        others = ", ".join(f"{k}/w {rel[k]:.2f}x" for k in (2, 4, 8))
        rows["lda_overpartition"] = [
            f"{_tokens(config)}, 16/worker: {med[16] * 1e3:.0f} ms/epoch ({others})", f"1/worker: {med[1] * 1e3:.0f} "
            f"ms/epoch", f"{rel[16]:.2f}x paired ({of_medians[16]:.2f}x of medians)", "<= 1.10x", _table.yes_no(met),
            _table.today()]
    print(f"-> {path}")
    for name in extra_corpora:
        if name not in summary:
            continue
        ex = summary[name]
        em, ratio, tokens = ex["epoch_s"], ex["ratio_16_vs_1"], _tokens(ex["config"])
        print(f"{tokens}: 1/worker {em[1] * 1e3:.0f} ms, 16/worker {em[16] * 1e3:.0f} ms: {ratio:.2f}x paired")
        first = ex["runs"][16][0]
        limit = 1.25 if name == "small_corpus" else 1.10
        rows[f"lda_overpartition ({tokens})"] = [
            f"16/worker: {em[16] * 1e3:.0f} ms/epoch (default settings: {first['blocks']} blocks, ahead "
            f"{'on' if first['ahead'] else 'off'}, {16 * WORKERS * first['blocks']} tasks an epoch)",
            f"1/worker: {em[1] * 1e3:.0f} ms/epoch", f"{ratio:.2f}x paired ({ex['ratio_of_medians']:.2f}x of medians)",
            f"<= {limit:.2f}x", _table.yes_no(ratio <= limit),
            _table.today()]
        for bx in ex.get("blocks", {}).values():
            b, a = bx["blocks"], bx["ahead"]
            what = f"blocks={b}" + ("" if a is None else f", ahead={a}")
            print(f"{tokens}, {what}: 16/worker {bx['epoch_s'] * 1e3:.0f} ms: {bx['ratio_16_vs_1']:.2f}x paired")
            rows[f"lda_overpartition ({tokens}, {what})"] = [
                f"16/worker, {what}: {bx['epoch_s'] * 1e3:.0f} ms/epoch ({16 * WORKERS * b} tasks an epoch, "
                f"LL/token {bx['ll_per_token']:.3f})",
                f"1/worker: {em[1] * 1e3:.0f} ms/epoch", f"{bx['ratio_16_vs_1']:.2f}x paired",
                "<= 1.25x", _table.yes_no(bx["ratio_16_vs_1"] <= 1.25), _table.today()]
    if not args.quick:
        _table.update_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
