"""Mutation score of the core's unit tests: the share of small code changes (mutants) the fast tests catch.

For each module below, every function in scope is mutated one change at a time (a small AST mutator of our own:
mutmut and cosmic-ray fight this layout, ``pythonpath = ["."]`` and tests that spawn processes), and the module's
FIXED set of fast unit tests runs against each mutant. A mutant is *killed* when a test fails, the module no
longer imports, or the run exceeds its timeout (a hung mutant); it *survives* when every test passes. Operators:
comparison swap (``<`` -> ``<=``, ``==`` -> ``!=``, ``in`` -> ``not in``, ...), ``and``/``or`` swap, arithmetic
swap (``+``/``-``, ``*``/``/``, ...), a number constant + 1, ``True``/``False`` swapped, a string constant ->
None, ``return x`` -> ``return None``, an ``if``/``while`` condition or conditional expression negated, ``not``
dropped, one statement replaced by ``pass``.

Mutants run in a copy of the repository in a temporary directory, never in this tree, so an interrupted run
leaves no mutated source behind. The runner imports pytest, numpy and the other third-party packages once. Per
module, a forked child (the zygote) imports the tests and litz from the copy once. Each mutant then runs in a
fork of the zygote, which swaps the mutated function's code object in and runs pytest in-process. Every
reference to the function, ``from .placement import quotas`` elsewhere included, runs the mutant. This takes
about 0.4 s of CPU a mutant, against about 1.5 s for a fresh interpreter. A module whose functions run as it is
imported (``protocol._shape`` builds ``SHAPES``) has each mutant written into the copy and imported afresh
instead. Each mutant has a timeout of 5 times the unmutated run, and at least 10 s. Hypothesis runs
derandomized with no example database, so a score is reproducible. A module with more than ``--max`` mutants is
sampled with a fixed seed (the output says so).

    python bench/mutation.py [--quick] [--module cache ...] [--max N] [--survivors]

``--quick`` samples 40 mutants per module (results/mutation.quick.json, table untouched); ``--survivors`` prints
each surviving mutant (tests/README.md explains the ones the full run leaves). Needs only the test extra
(``pip install -e '.[test]'``: pytest, hypothesis), no other tool. One core: the full run (about 1,150 mutants)
takes about 8 minutes of CPU, 16 minutes of wall time on a loaded 2-core machine.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import random
import shutil
import signal
import sys
import tempfile
import time

import _table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = 0.85  # share of mutants killed, per module


@dataclasses.dataclass
class Module:
    path: str  # the source file, relative to the repository
    tests: list[str]  # pytest arguments: the module's fast unit tests (nothing that starts processes)
    functions: tuple[str, ...] | None = None  # qualified names in scope (None: every function and method)
    skip: tuple[str, ...] = ()  # qualified names left out (say why in the comment)
    fresh_import: bool = False  # functions that run as the module is imported: mutate the file, import afresh


MODULES: dict[str, Module] = {
    "cache": Module("litz/cache.py", [
        "tests/test_cache.py", "tests/test_cache_props.py",
        "-k", "not end_to_end and not fails_the_job and not other_workers_writes"]),
    "placement": Module("litz/placement.py", ["tests/test_placement.py", "tests/test_placement_props.py"]),
    "checkpoint": Module("litz/checkpoint.py", ["tests/test_checkpoint_unit.py"],
                         # a test hook that SIGSTOPs its process, and durability calls (fsync, syncfs) whose
                         # absence no test short of a power cut can see
                         skip=("pause_for_test", "sync_filesystem", "_fsync_dir")),
    "keys": Module("litz/keys.py", ["tests/test_keys.py"]),
    "ssp": Module("litz/ssp.py", ["tests/test_ssp.py", "tests/test_ssp_unit.py",
                                  "--deselect", "tests/test_ssp.py::test_ssp_bound_through_real_processes"]),
    "protocol": Module("litz/protocol.py", ["tests/test_protocol_props.py", "tests/test_malformed_messages.py",
                                            "-k", "shapes or protocol_check"],
                       functions=("_shape", "check"), fresh_import=True),  # _shape builds SHAPES at import
    "sim checkers": Module("litz/sim/checkapp.py", ["tests/test_sim.py", "-k", "checker"],
                           functions=("CheckDriver.task_args", "CheckDriver.writes_before",
                                      "CheckDriver.handle_task_completion", "CheckDriver.check_ssp_bound",
                                      "CheckDriver.driver_read", "CheckDriver.verified", "CheckExecutor.run_task",
                                      "CheckExecutor.read")),
}

_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
        ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
        ast.Mod: ast.FloorDiv, ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr,
        ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitAnd}
_BOOL = {ast.And: ast.Or, ast.Or: ast.And}
NEGATE, DELETE = -1, -2  # variants of a condition and of a statement (others: 0, or the operator's index)


def _docstring(node: ast.AST, parent: ast.AST | None) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            and parent is not None and getattr(parent, "body", [None])[0] is node)


def _points(node: ast.AST, parent: ast.AST | None, in_fstring: bool = False) -> list[tuple[ast.AST, int, str]]:
    """The mutations of ``node``: (node, variant, description)."""
    out = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _CMP:
                out.append((node, i, f"{type(op).__name__} -> {_CMP[type(op)].__name__}"))
    elif isinstance(node, ast.BoolOp):
        out.append((node, 0, f"{type(node.op).__name__} -> {_BOOL[type(node.op)].__name__}"))
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BIN:
        out.append((node, 0, f"{type(node.op).__name__} -> {_BIN[type(node.op)].__name__}"))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        out.append((node, 0, f"drop {type(node.op).__name__}"))
    elif isinstance(node, ast.Constant) and not in_fstring:
        v = node.value
        if isinstance(v, bool):
            out.append((node, 0, f"{v} -> {not v}"))
        elif isinstance(v, (int, float)):
            out.append((node, 0, f"{v!r} -> {v + 1!r}"))
        elif isinstance(v, str):
            out.append((node, 0, f"{v[:20]!r} -> None"))
    elif isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        out.append((node, 0, "return x -> return None"))
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        out.append((node, NEGATE, f"negate {type(node).__name__} condition"))
    if isinstance(node, ast.stmt) and not isinstance(node, (ast.Pass, ast.FunctionDef, ast.ClassDef)) \
            and not _docstring(node, parent):
        out.append((node, DELETE, f"delete {type(node).__name__}"))
    return out


def _walk(node: ast.AST, in_fstring: bool = False):
    """Every node in a function's body with its parent, in a fixed order (not its signature, decorators or
    docstring; f-string parts are not mutated)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        children = node.body  # a nested def's signature is not mutated either
    elif isinstance(node, ast.AnnAssign):
        children = [c for c in (node.target, node.value) if c is not None]  # nor an annotation
    else:
        children = ast.iter_child_nodes(node)
    for child in children:
        if _docstring(child, node):
            continue
        yield child, node, in_fstring
        yield from _walk(child, in_fstring or isinstance(child, ast.JoinedStr))


def _scoped(tree: ast.Module, mod: Module) -> list[tuple[str, ast.AST]]:
    """(qualified name, def) of the functions and methods in scope, in source order."""
    out = []
    for node in tree.body:
        defs = [(node.name, node)] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        if isinstance(node, ast.ClassDef) and not any(getattr(b, "id", None) == "Protocol" for b in node.bases):
            defs = [(f"{node.name}.{f.name}", f) for f in node.body
                    if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for name, fn in defs:
            if (mod.functions is None or name in mod.functions) and name not in mod.skip:
                out.append((name, fn))
    return out


@dataclasses.dataclass
class Mutant:
    index: int  # in the module's fixed order
    function: str
    line: int
    what: str


def mutants(source: str, mod: Module) -> list[Mutant]:
    tree = ast.parse(source)
    found = []
    for name, fn in _scoped(tree, mod):
        for node, parent, in_f in _walk(fn):
            for _, _, what in _points(node, parent, in_f):
                found.append(Mutant(len(found), name, node.lineno, what))
    return found


def _mutate_node(node: ast.AST, parent: ast.AST, variant: int) -> None:
    """Apply mutation ``variant`` of ``node`` (as :func:`_points` numbers them) in place."""
    if variant == DELETE:
        for field in ("body", "orelse", "finalbody"):
            seq = getattr(parent, field, None)
            if isinstance(seq, list) and any(s is node for s in seq):
                seq[[i for i, s in enumerate(seq) if s is node][0]] = ast.Pass()
                return
        raise AssertionError("statement not found in its parent")
    if variant == NEGATE:
        node.test = ast.UnaryOp(ast.Not(), node.test)
    elif isinstance(node, ast.Compare):  # one variant per operator
        node.ops[variant] = _CMP[type(node.ops[variant])]()
    elif isinstance(node, ast.BoolOp):
        node.op = _BOOL[type(node.op)]()
    elif isinstance(node, (ast.BinOp, ast.AugAssign)):
        node.op = _BIN[type(node.op)]()
    elif isinstance(node, ast.UnaryOp):
        _replace(parent, node, node.operand)
    elif isinstance(node, ast.Constant):
        v = node.value
        node.value = (not v) if isinstance(v, bool) else v + 1 if isinstance(v, (int, float)) else None
    elif isinstance(node, ast.Return):
        node.value = ast.Constant(None)


def _replace(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for field, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, field, new)
            return
        if isinstance(value, list) and any(v is old for v in value):
            value[[i for i, v in enumerate(value) if v is old][0]] = new
            return
    raise AssertionError("node not found in its parent")


def mutate(source: str, mod: Module, index: int) -> str:
    """The module's source with mutant ``index`` applied."""
    tree = ast.parse(source)
    count = 0
    for _, fn in _scoped(tree, mod):
        for node, parent, in_f in list(_walk(fn)):
            for _, variant, _ in _points(node, parent, in_f):
                if count == index:
                    _mutate_node(node, parent, variant)
                    return ast.unparse(ast.fix_missing_locations(tree))
                count += 1
    raise IndexError(index)


# -- running --------------------------------------------------------------------------------------------------------
def _copy_tree() -> str:
    dest = tempfile.mkdtemp(prefix="litz-mutation-")
    ignore = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".hypothesis", ".pytest_cache", "results")
    for name in os.listdir(ROOT):
        src = os.path.join(ROOT, name)
        if name in (".git", "bench"):
            continue
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(dest, name), ignore=ignore, symlinks=True)
        else:
            shutil.copy2(src, dest)
    return dest


def _preload() -> None:
    """Import the third-party packages once, so each forked child only imports litz and the tests."""
    import hypothesis
    import numpy  # noqa: F401
    import pytest  # noqa: F401

    for name in ("zmq", "cloudpickle", "greenlet", "psutil", "scipy.sparse", "pytest_timeout"):
        try:
            __import__(name)
        except ImportError:
            pass
    hypothesis.settings.register_profile("mutation", database=None, derandomize=True, deadline=None,
                                         print_blob=False)
    assert not any(m == "litz" or m.startswith(("litz.", "tests")) for m in sys.modules), "litz imported too early"


def _quiet() -> tuple[int, int]:
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    return saved


def _pytest(args: list[str]) -> int:
    import hypothesis
    import pytest

    hypothesis.settings.load_profile("mutation")
    return pytest.main(["-x", "-q", "-p", "no:cacheprovider", *args])


def _unwrap(obj: object) -> object:
    if isinstance(obj, property):
        return obj.fget
    return getattr(obj, "__func__", obj)


def _swap(mod: Module, source: str, qualname: str) -> None:
    """Give the already imported function ``qualname`` of ``mod`` the code of its mutant in ``source``: every
    reference to it (``from .placement import quotas`` elsewhere included) then runs the mutant."""
    import importlib

    name = mod.path[:-3].replace("/", ".")
    live = importlib.import_module(name)
    space = {"__name__": name, "__package__": name.rpartition(".")[0], "__file__": live.__file__}
    exec(compile(source, live.__file__, "exec"), space)
    old, new = vars(live), space
    for part in qualname.split("."):
        old, new = _unwrap(old[part] if isinstance(old, dict) else vars(old)[part]), \
            _unwrap(new[part] if isinstance(new, dict) else vars(new)[part])
    old.__code__ = new.__code__


SWAP_FAILED = 3


def run_tests(args: list[str], timeout: float, setup=None) -> tuple[str, float]:
    """Run pytest on ``args`` in a forked child, after ``setup()`` there: ("passed" | "failed" | "timeout" |
    "swap failed", seconds)."""
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.setpgid(0, 0)
            _quiet()
            if setup is not None:
                try:
                    setup()
                except ValueError:  # a code object with other free variables: cannot be swapped in
                    os._exit(SWAP_FAILED)
            os._exit(0 if _pytest(args) == 0 else 1)
        except BaseException:
            os._exit(1)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return {0: "passed", SWAP_FAILED: "swap failed"}.get(code, "failed"), time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - t0
        time.sleep(0.002)


def _outcomes(mod: Module, original: str, chosen: list[Mutant], tree: str) -> tuple[str, float, list[str]]:
    """The unmutated run's outcome and seconds, and each chosen mutant's outcome. ``fresh_import`` modules: the
    mutant is written into the copy and each child imports litz afresh. Others: a child of this process (the zygote)
    imports the tests and litz once, and each mutant's child swaps the mutated function's code in."""
    if mod.fresh_import:
        path = os.path.join(tree, mod.path)
        base, base_s = run_tests(mod.tests, 120)
        if base != "passed":
            return base, base_s, []
        timeout = max(10.0, 5 * base_s)
        out = []
        try:
            for m in chosen:
                with open(path, "w") as f:
                    f.write(mutate(original, mod, m.index))
                out.append(run_tests(mod.tests, timeout)[0])
        finally:
            with open(path, "w") as f:
                f.write(original)
        return base, base_s, out
    import json

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the zygote
        try:
            os.close(read)
            saved = _quiet()
            rc = _pytest(["--collect-only", *mod.tests])  # imports the test modules and litz, once
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            base, base_s = run_tests(mod.tests, 120) if rc == 0 else ("collection failed", 0.0)
            out = []
            if base == "passed":
                timeout = max(10.0, 5 * base_s)
                out = [run_tests(mod.tests, timeout, lambda m=m: _swap(mod, mutate(original, mod, m.index),
                                                                        m.function))[0] for m in chosen]
            with os.fdopen(write, "w") as f:
                json.dump([base, base_s, out], f)
            os._exit(0)
        except BaseException:
            import traceback

            traceback.print_exc()
            os._exit(1)
    os.close(write)
    with os.fdopen(read) as f:
        data = f.read()
    os.waitpid(pid, 0)
    if not data:
        raise SystemExit(f"{mod.path}: the mutation runner failed")
    base, base_s, out = json.loads(data)
    return base, base_s, out


def score(name: str, mod: Module, tree: str, limit: int | None, seed: int, verbose: bool) -> dict:
    with open(os.path.join(tree, mod.path)) as f:
        original = f.read()
    found = mutants(original, mod)
    chosen = found
    if limit is not None and len(found) > limit:
        chosen = sorted(random.Random(f"{seed}:{name}").sample(found, limit), key=lambda m: m.index)
    t0 = time.monotonic()
    base, base_s, outcomes = _outcomes(mod, original, chosen, tree)
    if base != "passed":
        raise SystemExit(f"{name}: the unmutated tests do not pass ({base}): {' '.join(mod.tests)}")
    survivors = [m for m, o in zip(chosen, outcomes, strict=True) if o == "passed"]
    unrun = [m for m, o in zip(chosen, outcomes, strict=True) if o == "swap failed"]
    run = len(chosen) - len(unrun)
    killed = run - len(survivors)
    if verbose:
        for m in survivors:
            print(f"  survived: {mod.path}:{m.line} {m.function}: {m.what}", flush=True)
        for m in unrun:
            print(f"  not run (its code cannot be swapped in): {mod.path}:{m.line} {m.function}: {m.what}")
    share = killed / run if run else 1.0
    return {"module": mod.path, "functions": sorted({m.function for m in found}), "tests": mod.tests,
            "mutants": len(found), "run": run, "sampled": len(chosen) < len(found), "killed": killed,
            "timeouts": outcomes.count("timeout"), "not_run": [dataclasses.asdict(m) for m in unrun],
            "score": share, "met": share >= TARGET, "baseline_s": base_s, "seconds": time.monotonic() - t0,
            "survivors": [dataclasses.asdict(m) for m in survivors]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="40 mutants per module (results/mutation.quick.json)")
    ap.add_argument("--module", action="append", choices=sorted(MODULES), help="only these (repeatable)")
    ap.add_argument("--max", type=int, default=None, help="sample at most N mutants per module (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sample")
    ap.add_argument("--survivors", action="store_true", help="print each surviving mutant")
    ap.add_argument("--repeats", type=int, default=1, help=argparse.SUPPRESS)  # every bench script takes it
    args = ap.parse_args()
    limit = 40 if args.quick else args.max
    names = args.module or list(MODULES)
    _preload()
    tree = _copy_tree()
    results = {}
    cwd, path = os.getcwd(), list(sys.path)
    os.chdir(tree)
    sys.path.insert(0, tree)
    sys.dont_write_bytecode = True  # the copy's mutated files must never be read back from a stale .pyc
    try:
        for name in names:
            r = results[name] = score(name, MODULES[name], tree, limit, args.seed, args.survivors)
            sampled = f" (a sample of {r['run']} of {r['mutants']}, seed {args.seed})" if r["sampled"] else ""
            print(f"{name:13s} {r['killed']}/{r['run']} killed = {r['score']:.1%}{sampled}, {r['timeouts']} by "
                  f"timeout, {len(r['survivors'])} survived, {r['seconds']:.0f} s "
                  f"({'met' if r['met'] else 'MISSED'} >= {TARGET:.0%})", flush=True)
    finally:
        os.chdir(cwd)
        sys.path[:] = path
        shutil.rmtree(tree, ignore_errors=True)
    met = all(r["met"] for r in results.values())
    sys.path.insert(0, ROOT)  # the litz measured is this tree's, whatever is installed
    path = _table.write_result("mutation", {"target": f">= {TARGET:.0%} of mutants killed per module", "met": met,
                                            "seed": args.seed, "max": limit, "modules": results}, quick=args.quick)
    print(f"-> {path}")
    if not args.quick and args.max is None:
        _table.update_rows({
            f"mutation ({name})": [f"{r['killed']}/{r['run']} mutants killed", "-", f"{r['score']:.1%}",
                                   f">= {TARGET:.0%}", _table.yes_no(r["met"]), _table.today()]
            for name, r in results.items()})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
