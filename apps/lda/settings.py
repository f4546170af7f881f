"""The LDA app's configuration (``--config key=value``), validated once so a typo is one clear error."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from litz.appconfig import ConfigError, with_defaults
from litz.appconfig import boolean as _bool
from litz.appconfig import integer as _int
from litz.appconfig import number as _float
from litz.appconfig import optional_integer as _opt_int
from litz.appconfig import path as _path
from litz.appconfig import positive as _pos

DEFAULTS: dict[str, Any] = {
    # data: exactly one of corpus=PATH (UCI docword.txt) or synthetic=1
    "corpus": None, "vocab_file": None, "synthetic": False,
    "docs": 5000, "vocab": 2000, "doc_length": 100, "gen_alpha": 0.1, "gen_beta": 0.01,
    # model and schedule
    "topics": 20, "alpha": 0.1, "beta": 0.01, "epochs": 20, "blocks": None, "seed": 0, "chain_seed": None,
    # outputs and checks
    "output": None, "top_words": 10, "check_counts": False, "recovery_every": 0,
    "ahead": None,  # dispatch each round once its two predecessors are dispatched, with after= (see apps/lda);
    # None: when there are fewer blocks than executors
}


@dataclass(frozen=True)
class Settings:
    corpus: str | None
    vocab_file: str | None
    synthetic: bool
    docs: int
    vocab: int
    doc_length: float
    gen_alpha: float
    gen_beta: float
    topics: int
    alpha: float
    beta: float
    epochs: int
    blocks: int | None
    seed: int
    chain_seed: int | None
    output: str | None
    top_words: int
    check_counts: bool
    recovery_every: int
    ahead: bool | None

    @classmethod
    def from_config(cls, config: dict | None) -> Settings:
        """Defaults filled in, types checked; raises :class:`ConfigError` naming the bad key."""
        v = with_defaults("apps.lda", config, DEFAULTS)
        out: dict[str, Any] = {
            "corpus": _path(v, "corpus"), "vocab_file": _path(v, "vocab_file"),
            "synthetic": _bool(v, "synthetic"), "docs": _int(v, "docs", 1), "vocab": _int(v, "vocab", 2),
            "doc_length": _float(v, "doc_length", 1.0), "gen_alpha": _pos(v, "gen_alpha"),
            "gen_beta": _pos(v, "gen_beta"), "topics": _int(v, "topics", 2), "alpha": _pos(v, "alpha"),
            "beta": _pos(v, "beta"), "epochs": _int(v, "epochs", 0),
            "blocks": _opt_int(v, "blocks", 1), "seed": _int(v, "seed", 0),
            "chain_seed": _opt_int(v, "chain_seed", 0),
            "output": _path(v, "output"), "top_words": _int(v, "top_words", 0),
            "check_counts": _bool(v, "check_counts"), "recovery_every": _int(v, "recovery_every", 0),
            "ahead": None if v["ahead"] is None else _bool(v, "ahead"),
        }
        if out["synthetic"] == (out["corpus"] is not None):
            raise ConfigError("apps.lda needs exactly one of config 'corpus' (a UCI bag-of-words docword.txt) "
                              "or 'synthetic=1'")
        if out["recovery_every"] and not out["synthetic"]:
            raise ConfigError("config 'recovery_every' needs 'synthetic=1': topic recovery compares with the true "
                              "topics")
        if out["topics"] > 32767:
            raise ConfigError(f"config 'topics' must be at most 32767, got {out['topics']}")
        if out["corpus"] is not None and not os.path.isfile(out["corpus"]):
            raise ConfigError(f"{out['corpus']}: no such file (config 'corpus')")
        if out["vocab_file"] is not None and not os.path.isfile(out["vocab_file"]):
            raise ConfigError(f"{out['vocab_file']}: no such file (config 'vocab_file')")
        assert {f.name for f in fields(cls)} == set(out)
        return cls(**out)

    @property
    def sampler_seed(self) -> int:
        """Seeds the Markov chain (initial topics, sampling); ``seed`` also seeds the synthetic corpus."""
        return self.seed if self.chain_seed is None else self.chain_seed

    def num_blocks(self, num_executors: int, vocab_size: int, tokens: int, min_blocks: int = 0) -> int:
        """Vocabulary blocks B: ``blocks`` if set, at most the vocabulary size. By default one per executor when
        a task (an executor's tokens of one block, ``tokens / E**2``) then samples at least ``TASK_TOKENS``;
        else one per worker at the start (``min_blocks``; at least 2), each a chain of larger tasks handed on
        from executor to executor. Never more than the executors or the words. See apps/lda/README.md, *Blocks*."""
        if self.blocks:
            return max(1, min(self.blocks, vocab_size))
        E = num_executors
        wanted = E if tokens // (E * E) >= TASK_TOKENS else max(2, min_blocks)
        return max(1, min(E, vocab_size, wanted))


# One block per executor when a task then samples at least this many tokens: at about 90 ns a token that is
# 3.5 ms, against about 0.2 ms of CPU the runtime spends on each task (dispatch, fetch, flush, completion).
TASK_TOKENS = 40_000
