"""The model file of every bundled app: ``--config output=PATH`` writes one ``.npz`` of named arrays there.

One format for all four apps (``numpy.load(PATH)`` reads it back, no pickles), and one way to get there: the
driver checks the path before training (:func:`model_path`: the parent directory is created, as ``mkdir -p``
does, so a bad path fails in the first second and not after the training) and writes the file atomically at the
end (:func:`save_model`). The driver runs in the master, so PATH is on the master's machine. Each app's README
lists the arrays it writes.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from litz.appconfig import ConfigError
from litz.errors import LitzError
from litz.joblog import make_parent


def model_path(path: str | None) -> str | None:
    """``path`` (``output``) made absolute, with its parent directory created; None stays None. A directory, or a
    parent that cannot be created or written, is one clear error naming the key."""
    if path is None:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(path):
        raise ConfigError(f"config 'output': {path} is a directory, expected a file name for the model (.npz)")
    try:
        make_parent(path, "config 'output'")  # the same directory rule as --output and --metrics
    except LitzError as exc:
        raise ConfigError(str(exc)) from None
    return path


def save_model(path: str, arrays: dict[str, object]) -> str:
    """Write ``arrays`` (name -> array or number) to ``path`` exactly (no suffix added) as an uncompressed
    ``.npz``: to a temporary file in the same directory, then renamed, so a reader never sees half a model."""
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".model-", suffix=".npz", dir=parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **{name: np.asarray(value) for name, value in arrays.items()})
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        raise ConfigError(f"config 'output': cannot write the model to {path} ({e.strerror or e})") from None
    return path


def load_model(path: str) -> dict[str, np.ndarray]:
    """Every array of a model file, by name."""
    with np.load(path, allow_pickle=False) as f:
        return {name: f[name] for name in f.files}
