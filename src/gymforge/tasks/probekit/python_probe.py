"""gymforge evaluator probe: stands in for a submission module whose public functions answer degenerately.

Written into the probe's workspace at the submission module's path (never run on the host). Beside it lie the
baseline's module, renamed, and a JSON file (`GYMFORGE_PROBE_PARAMS`) with the settings:
- "original": the baseline module's name (its file is "<original>.py" in this folder);
- "functions": the public functions to wrap;
- "transform": how each answer is spoilt (see `_degenerate`);
- "not_applicable": the exit status that tells the host this transform has nothing to say about the task.

On import it loads the baseline's module, takes over its names and wraps the listed functions: each calls the
baseline's function (so it learns the answer's shape at run time) and returns a degenerate value of that shape. The
first answer the transform leaves unchanged, or one it cannot spoil (text; a number, for the transforms under which
a number is a plausible answer), ends the process with the "not_applicable" status.

gymforge imports this file on the host only for `set_numbers` (as `gymforge.tasks.probekit.python_probe`); under
that name it loads and wraps nothing.
"""

import importlib.util as _util
import json as _json
import os as _os
import sys as _sys

GYMFORGE_PROBE_PARAMS = "_gymforge_probe.json"  # (a name no submission module will have)
_HOST_NAME = "gymforge.tasks.probekit.python_probe"
_CALLED = []  # not empty once a wrapped function has answered (only the first answer is compared)
_SCALAR_SAFE = ("empty", "huge", "negative_huge", "none", "echo")  # transforms that spoil a number


def set_numbers(value, new):
    """`value` with every number in it, at any depth, set to `new` (ints stay ints, floats floats, bools as they
    are); dicts, lists, tuples, named tuples and numpy arrays keep their kind. Other values are left as they are."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(new)
    if isinstance(value, float):
        return float(new)
    if isinstance(value, dict):
        return {k: set_numbers(v, new) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return _same_kind(value, [set_numbers(v, new) for v in value])
    if hasattr(value, "tolist") and hasattr(value, "shape"):
        import numpy

        try:
            return numpy.asarray(set_numbers(value.tolist(), new), dtype=value.dtype)
        except OverflowError:
            return numpy.asarray(set_numbers(value.tolist(), new))
    return value


def _same_kind(value, items):
    """`items` as a list, tuple or named tuple like `value`."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*items)
    return type(value)(items)


def _longest(args):
    sized = [a for a in args if isinstance(a, (list, tuple, dict, str)) or hasattr(a, "__len__")]
    return max((len(a) for a in sized), default=0)


class _NotApplicable(Exception):
    """The transform has no degenerate form for this answer."""


def _degenerate(value, args, transform):
    """The degenerate answer `transform` makes of the baseline's `value` for a call with positional `args`."""
    scalar = isinstance(value, (int, float)) or value is None
    if isinstance(value, str) and transform not in ("empty", "none", "echo"):
        raise _NotApplicable("the function returns text")
    if scalar and transform not in _SCALAR_SAFE:
        # A number's zero, one or first element is a plausible answer (a game's move), not a degenerate one.
        raise _NotApplicable("the function returns a number")
    if transform == "none":
        return None
    if transform == "echo":
        return args[0] if args else value
    if transform == "huge":
        return set_numbers(value, 10**12)
    if transform == "negative_huge":
        return set_numbers(value, -(10**12))
    if transform == "zeros":
        return set_numbers(value, 0)
    if transform == "ones":
        return set_numbers(value, 1)
    if hasattr(value, "tolist") and hasattr(value, "shape"):
        import numpy

        return numpy.asarray(_degenerate(value.tolist(), args, transform))
    if transform == "empty":
        if scalar:
            return None
        return () if isinstance(value, tuple) and hasattr(value, "_fields") else type(value)()
    if transform == "first_repeated":
        if isinstance(value, dict) and value:
            first = next(iter(value.values()))
            return {k: first for k in value}
        if isinstance(value, (list, tuple)) and value:
            return _same_kind(value, [value[0]] * len(value))
        return value
    if transform == "all_indices":
        n = _longest(args)
        nested = isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple))
        return [list(range(n))] if nested else list(range(n))
    return value


def _not_applicable(why, status):
    # The exit status tells the host that this probe has nothing to say about this task.
    print(f"gymforge probe: not applicable ({why})", file=_sys.stderr, flush=True)
    _os._exit(status)


def _wrap(function, transform, not_applicable):
    """`function`, answering as `transform` makes of its answers; the process ends with `not_applicable` on an
    answer the transform cannot spoil, or when the first answer of any wrapped function is left as it was."""
    def probe(*args, **kwargs):
        value = function(*args, **kwargs)
        try:
            changed = _degenerate(value, args, transform)
        except _NotApplicable as why:
            _not_applicable(why, not_applicable)
        if not _CALLED:
            _CALLED.append(True)
            try:
                same = type(changed) is type(value) and bool(changed == value)
            except Exception:
                same = False
            if same:  # the transform leaves the baseline's answer as it is: nothing to probe
                _not_applicable("the answer has no such degenerate form", not_applicable)
        return changed

    probe.__name__ = probe.__qualname__ = function.__name__
    probe.__doc__ = function.__doc__
    return probe


def _install(namespace):
    """Load the baseline's module beside this file and make `namespace` (this module's) stand in for it."""
    folder = _os.path.dirname(_os.path.abspath(namespace["__file__"]))
    with open(_os.path.join(folder, GYMFORGE_PROBE_PARAMS)) as f:
        params = _json.load(f)
    name = params["original"]
    spec = _util.spec_from_file_location(name, _os.path.join(folder, f"{name}.py"))
    original = _util.module_from_spec(spec)
    _sys.modules[name] = original
    spec.loader.exec_module(original)
    own = set(namespace)  # this file's names win over the baseline's
    namespace.update({k: v for k, v in vars(original).items() if not k.startswith("__") and k not in own})
    for function in params["functions"]:
        namespace[function] = _wrap(getattr(original, function), params["transform"], params["not_applicable"])


if __name__ != _HOST_NAME:
    _install(globals())
