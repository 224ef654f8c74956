"""The prediction model every command uses: the promoted fit of the snapshot (else the store), or the priors."""

from __future__ import annotations

import sys

from models.core.params import DEFAULT
from models.fitting.predictor import Calibration, Predictor
from pipeline import store
from pipeline.fits import load_promoted_fit
from pipeline.settings import Settings


def from_readable_store(cfg: Settings, read):
    """`read(con, path)` on the snapshot, then on the store (skipping a missing one or one a writer holds);
    the first result that is not None, or None."""
    for path in (cfg.snapshot, cfg.store):
        if not path.exists():
            continue
        try:
            con = store.connect(path, read_only=True)
        except Exception:  # noqa: BLE001 - locked by a writer: try the next
            continue
        try:
            result = read(con, path)
        finally:
            con.close()
        if result is not None:
            return result
    return None


#: fits read once for a long-running reader (`stepcast serve`, `pin_promoted_fit`), by settings
_PINNED: dict = {}


def pin_promoted_fit(cfg: Settings):
    """Read the promoted fit once; later `promoted_fit(cfg)` calls answer from memory (the fit the process
    started with) instead of opening the store on every call. Returns the fit (or None)."""
    _PINNED.pop(cfg, None)
    _PINNED[cfg] = promoted_fit(cfg)
    return _PINNED[cfg]


def promoted_fit(cfg: Settings):
    """The promoted fit (a `models.fitting.predictor.Calibration`) from the snapshot (or the store when there is no
    snapshot), or None. A stored fit of an earlier format (before the one prediction function) is reported
    and skipped: run `stepcast fit` to make a current one."""
    if cfg in _PINNED:
        return _PINNED[cfg]

    def read(con, path):
        try:
            fit = load_promoted_fit(con)
        except Exception as err:  # noqa: BLE001 - an unreadable fit must not stop an analytical answer
            print(f"warning: promoted fit in {path} not usable ({err}); analytical figures only", file=sys.stderr)
            return None
        if fit is not None and not isinstance(fit, Calibration):
            print(f"warning: the promoted fit in {path} is of an earlier format; run `stepcast fit` "
                  "(analytical figures until then)", file=sys.stderr)
            return None
        return fit

    return from_readable_store(cfg, read)


def model_for(cfg: Settings, analytical_only: bool = False, assumptions: str = "realistic"):
    """The prediction model every command uses (`models.fitting.predictor`): the priors' analytical model with
    `--analytical-only`, else the promoted calibration (None -> priors) under the named assumptions."""
    if analytical_only:
        return DEFAULT
    return Predictor(None if assumptions == "ideal" else promoted_fit(cfg), assumptions)
