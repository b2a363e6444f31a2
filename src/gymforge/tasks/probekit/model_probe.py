"""gymforge evaluator probe: a pickled model wrapped so that its predictions become degenerate.

Written into the probe's workspace as `_gymforge_probe.py` (never run on the host). The probe's pickle, where the
task's config names its model, is a call of `make(transform, *candidates)`: unpickled in the submission's sandbox, it
loads the baseline's pickled model from the first of `candidates` that exists (an evaluator resolves the config's
path from the working directory or from the config's folder). `predict` and `predict_proba` answer as `degrade`
makes of the model's answers; anything else is the baseline's model.
"""

import os
import pickle

import numpy


def degrade(p, transform):
    """The predictions `p` made degenerate by `transform`."""
    p = numpy.asarray(p)
    if transform == "constant_first":
        return numpy.broadcast_to(p[:1], p.shape).copy() if p.size else p
    if transform == "zeros":
        return numpy.zeros_like(p)
    if transform == "mean":
        if p.dtype.kind not in "iufb" or not p.size:
            return p
        return numpy.broadcast_to(p.astype(float).mean(axis=0), p.shape).copy()
    if transform == "short":
        return p[:-1]
    if transform == "first_half":
        return p[: len(p) // 2]
    if transform == "two_columns":
        return numpy.stack([p, p], axis=-1)
    if transform == "empty":
        return p[:0]
    if transform == "nan":
        return numpy.full(p.shape, numpy.nan)
    return p


class Probe:
    """The baseline's model, loaded on first use, with degenerate predictions."""

    def __init__(self, transform, *candidates):
        self.transform, self.candidates = transform, candidates
        self._model = None

    def __getattr__(self, name):
        if name.startswith("_") or name in ("transform", "candidates"):
            raise AttributeError(name)
        return getattr(self._loaded(), name)

    def _loaded(self):
        if self._model is None:
            path = next((c for c in self.candidates if os.path.isfile(c)), self.candidates[0])
            with open(path, "rb") as fh:
                self._model = pickle.load(fh)
        return self._model

    def predict(self, features):
        return degrade(self._loaded().predict(features), self.transform)

    def predict_proba(self, features):
        return degrade(self._loaded().predict_proba(features), self.transform)


def make(transform, *candidates):
    """What the probe's pickle calls when it is loaded."""
    return Probe(transform, *candidates)
