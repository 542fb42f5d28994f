"""SkewAdam and its variants as torch.optim.Optimizer subclasses.

Each class is built from ``model.named_parameters()``: names decide tiers
(experts, router, backbone; ``tier_rules`` adds rules before the defaults),
and checkpoints are keyed by name. The step runs in the compiled library on
the parameters' own memory (CPU, or one CUDA device), with no copy of
parameters or gradients.
"""

import math
import numbers
import os
import weakref

import torch

from . import _skewadam

TIERS = ("backbone", "experts", "router")
HYPER_KEYS = ("lr", "betas", "eps", "weight_decay", "clip_threshold", "clip_scope")
STATE_ARRAYS = ("m", "v", "v_row", "v_col")
STATE_FORMAT = 1

NonFiniteGradientError = _skewadam.NonFiniteGradientError
CheckpointError = _skewadam.CheckpointError


class StepReport:
    """What the last step() did: ``applied`` is False when a non-finite
    gradient made it skip (nonfinite="skip"); then ``name`` is the first
    offending parameter, ``element`` the flat index of its first offending
    element and ``value`` that element. A step taken inside backward skips
    the offending tensors alone (``skipped`` counts them), and reports
    ``stepped`` (tensors it took) and ``not_stepped`` (the parameters no
    gradient reached, by name); ``interrupted`` is True when its backward
    raised part way, the tensors stepped before staying stepped. ``measured``
    is True (and ``applied`` False) for a step that only measured the global
    norm the next one clips by (clip_norm="previous" with none before it)."""

    __slots__ = ("applied", "name", "element", "value", "message", "interrupted", "stepped", "not_stepped",
                 "skipped", "measured")

    def __init__(self, applied, name, element, value, message, interrupted=False, stepped=0, not_stepped=(),
                 skipped=0, measured=False):
        self.applied = applied
        self.name = name
        self.element = element
        self.value = value
        self.message = message
        self.interrupted = interrupted
        self.stepped = stepped
        self.not_stepped = list(not_stepped)
        self.skipped = skipped
        self.measured = measured

    def __bool__(self):
        return self.applied

    def __repr__(self):
        return f"StepReport(applied={self.applied}, {self.message!r})"


def _backward_step(owner_key, name):
    """The hook of parameter `name`: steps it in its optimizer, if alive."""
    def step_it():
        opt = owner_key()
        if opt is not None:
            opt._engine.step_parameter(name, opt._group_hyper())
    return step_it


# Parameters stepped inside backward, by id(tensor): (weakref to the tensor,
# weakref to the optimizer whose hooks step it). Two optimizers never both do.
_stepping_inside_backward = {}


def _remove_backward_hooks(hooks, owner_key):
    """Removes step_in_backward()'s hooks: on step_in_backward(False), or
    when their optimizer is collected (holds no reference to it)."""
    for h in hooks:
        h.remove()
    hooks.clear()
    for key in [k for k, (_, owner) in _stepping_inside_backward.items() if owner is owner_key]:
        del _stepping_inside_backward[key]


# The Python half only translates: it turns Python values into the types the
# compiled library takes (a TypeError naming the argument where that is
# impossible), and the library checks every value, raising ValueError with
# the argument's name (its C++ checks; nothing is checked twice).

def _number(value, key, where):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}{key}: expected a number, got {type(value).__name__}")
    return float(value)


def _string(value, key, where=""):
    if not isinstance(value, str):
        raise TypeError(f"{where}{key}: expected a str, got {type(value).__name__}")
    return value


def _hyper_tuple(h, where):
    """(lr, beta1, beta2, eps, weight_decay, clip_threshold, clip_scope) of a
    dict holding HYPER_KEYS, as the library takes them (it checks them)."""
    betas = h["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"{where}betas: expected a pair (beta1, beta2), got {betas!r}")
    scope = _string(h["clip_scope"], "clip_scope", where)
    return (_number(h["lr"], "lr", where), _number(betas[0], "betas[0]", where), _number(betas[1], "betas[1]", where),
            _number(h["eps"], "eps", where), _number(h["weight_decay"], "weight_decay", where),
            _number(h["clip_threshold"], "clip_threshold", where), scope)


def _named(named_parameters):
    """A list of (name, tensor) from named_parameters() or a dict."""
    if isinstance(named_parameters, torch.Tensor):
        raise TypeError("named_parameters: got one tensor; pass model.named_parameters() (names decide the tiers)")
    items = named_parameters.items() if isinstance(named_parameters, dict) else named_parameters
    out = []
    try:
        iterator = iter(items)
    except TypeError:
        raise TypeError("named_parameters: expected model.named_parameters() or a dict from names to tensors, "
                        f"got {type(named_parameters).__name__}") from None
    for i, item in enumerate(iterator):
        if isinstance(item, torch.Tensor) or not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"named_parameters[{i}]: expected a (name, tensor) pair; pass model.named_parameters(), "
                            "not model.parameters() (names decide the tiers)")
        name, tensor = item
        if not isinstance(name, str):
            raise TypeError(f"named_parameters[{i}]: the name is a {type(name).__name__}, not a str")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"parameter '{name}': expected a tensor, got {type(tensor).__name__}")
        if tensor.is_sparse:
            raise ValueError(f"parameter '{name}': sparse tensors are not supported")
        if not tensor.is_leaf:
            raise ValueError(f"parameter '{name}': not a leaf tensor (optimizers update leaves)")
        if tensor.device.type == "cuda" and not _skewadam.cuda:
            raise ValueError(f"parameter '{name}': on {tensor.device}, and this build of skewadam has no CUDA "
                             "engines (it builds them when the installed torch has CUDA and nvcc is found)")
        if tensor.device.type not in ("cpu", "cuda"):
            raise ValueError(f"parameter '{name}': on {tensor.device}; parameters must be on the CPU or a CUDA "
                             "device")
        out.append((name, tensor))
    if not out:
        raise ValueError("named_parameters: empty; the optimizer needs at least one parameter")
    return out


class TieredOptimizer(torch.optim.Optimizer):
    """A torch optimizer over one of the library's variants (the subclasses
    below). Keyword arguments apply to every tier; ``per_tier`` overrides
    them per tier, e.g. ``per_tier={"router": {"weight_decay": 0.0}}``.

    Arguments:
        named_parameters: model.named_parameters(), or a dict from names to
            tensors: contiguous float32, bfloat16 or float16 tensors on the CPU
            or on one CUDA device, which stay where they are (create the
            optimizer after ``model.to(...)``). A tensor under two names (tied
            weights) is updated once, under its first name.
        lr, betas, eps, weight_decay, clip_threshold: docs/spec.md §3 (eps is a
            floor under the second-moment estimate; AdamW adds it to sqrt(v)).
        clip_scope: "tensor" (one update RMS per tensor) or "matrix" (one per
            [r, c] matrix of a stacked expert bank).
        max_grad_norm: None or 0 (off), or clip the global gradient norm to
            this before every step (as torch.nn.utils.clip_grad_norm_, without
            writing the gradients).
        clip_norm: which norm max_grad_norm clips by: "current" (this step's,
            exactly as clip_grad_norm_) or "previous" (the previous step's,
            taken as each gradient is stepped: what the step inside backward
            can clip by; docs/spec.md E8).
        nonfinite: a step with a NaN or infinite gradient is skipped as a
            whole ("skip", last_step() says which), raises
            NonFiniteGradientError ("raise"), or is not checked ("unchecked").
        seed: the stochastic-rounding seed of bf16 and fp16 parameters.
        tier_rules: (regex, tier) pairs tried in order before the defaults
            ("experts" -> experts; "router" or a ".gate." component -> router;
            the rest -> backbone).
        per_tier: {tier: {keyword: value}} overrides of lr, betas, eps,
            weight_decay, clip_threshold and clip_scope.
        threads: CPU threads of the step (default: torch.get_num_threads();
            0: the hardware's count).

    One param group per tier, in the order backbone, experts, router, each
    with a "tier" key (a group may be empty): torch.optim.lr_scheduler and
    code that edits a group's "lr" work as usual; the groups' values are read
    at every step. Parameters cannot be added after construction.
    """

    _engine_type = None  # the compiled engine, set by each subclass

    def __init__(self, named_parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 clip_threshold=1.0, clip_scope="tensor", max_grad_norm=None, clip_norm="current", nonfinite="skip",
                 seed=0x5EED5EED, tier_rules=(), per_tier=None, threads=None):
        if type(self)._engine_type is None:
            raise TypeError("TieredOptimizer is abstract: use SkewAdam, AdamW, AdafactorLike, UniformAblation, "
                            "ExpertMomentumAblation, FactoredRouterAblation or ExactExpertsAblation")
        named = _named(named_parameters)
        base = {"lr": lr, "betas": tuple(betas) if isinstance(betas, (tuple, list)) else betas, "eps": eps,
                "weight_decay": weight_decay, "clip_threshold": clip_threshold, "clip_scope": clip_scope}
        tiers = {t: dict(base) for t in TIERS}
        if per_tier is not None:
            if not isinstance(per_tier, dict):
                raise TypeError(f"per_tier: expected a dict from tier to overrides, got {type(per_tier).__name__}")
            for tier, overrides in per_tier.items():
                if tier not in TIERS:
                    raise ValueError(f"per_tier: unknown tier {tier!r} (expected backbone, experts or router)")
                if not isinstance(overrides, dict):
                    raise TypeError(f"per_tier[{tier!r}]: expected a dict of keyword overrides")
                for key, value in overrides.items():
                    if key not in HYPER_KEYS:
                        raise ValueError(f"per_tier[{tier!r}]: unknown keyword {key!r} (expected one of "
                                         f"{', '.join(HYPER_KEYS)})")
                    tiers[tier][key] = tuple(value) if key == "betas" and isinstance(value, (tuple, list)) else value
        hyper = [_hyper_tuple(tiers[t], f"{t}.") for t in TIERS]
        norm = 0.0 if max_grad_norm is None else _number(max_grad_norm, "max_grad_norm", "")
        _string(clip_norm, "clip_norm")
        _string(nonfinite, "nonfinite")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**64:
            raise TypeError(f"seed: expected an integer in [0, 2**64), got {seed!r}")
        rules = []
        for i, rule in enumerate(tier_rules):
            if not isinstance(rule, (tuple, list)) or len(rule) != 2 or not all(isinstance(x, str) for x in rule):
                raise TypeError(f"tier_rules[{i}]: expected a (regex, tier) pair of strings, got {rule!r}")
            rules.append((rule[0], rule[1]))
        if threads is None:
            threads = torch.get_num_threads()
        if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or not -2**31 <= threads < 2**31:
            raise TypeError(f"threads: expected an integer, got {threads!r}")

        self._engine = type(self)._engine_type(named, rules, hyper, norm, clip_norm, nonfinite, int(seed), int(threads))
        tensors = {}
        for name, tensor in named:
            tensors.setdefault(name, tensor)
        self._names = self._engine.names()  # registration order; tied duplicates dropped
        self._name_of = {id(tensors[n]): n for n in self._names}
        self._tensor_of = {n: tensors[n] for n in self._names}
        groups = []
        for t in TIERS:
            group = {"params": [tensors[n] for n in self._names if self._engine.tier(n) == t], "tier": t}
            group.update(tiers[t])
            groups.append(group)
        defaults = dict(base)
        defaults["tier"] = None
        self._built = False
        self._hooks_finalizer = None
        self._accumulators = []
        super().__init__(groups, defaults)
        self._built = True
        self._refresh_state()

    # ----------------------------------------------------------------- step
    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient (a parameter
        whose .grad is None keeps its state and step count). With a closure,
        runs it first with gradients enabled and returns its loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._engine.step(self._group_hyper())
        return loss

    def step_in_backward(self, on=True):
        """From now on each parameter is stepped inside backward, as soon as
        backward has completed its gradient, and that gradient is freed at
        once (its .grad is None again), so that no more than a few gradients
        are alive at a time. Call step() after backward: it steps what still
        holds a gradient and ends the optimizer step. The bits are those of
        the plain step().

        Refused here, before any backward: global-norm clipping by the
        current norm (max_grad_norm with clip_norm="current" needs every
        gradient; clip_norm="previous" clips inside backward), and parameters
        another live
        optimizer already steps inside backward. Frozen parameters
        (requires_grad=False) are left alone, as torch's optimizers leave
        them. A non-finite gradient skips its own tensor alone (last_step()
        after step() names the first); under nonfinite="raise" the hook
        raises out of backward and the gradient is freed.

        A backward that raises part way (out of memory, a failing function)
        leaves stepped what it stepped: zero_grad(), step() or the next
        backward ends that optimizer step, and last_step() reports it
        (interrupted, stepped, not_stepped). Gradients are not accumulated
        over several backward passes in this mode: a second backward before
        step() is refused by its first hook, before it changes anything.

        The hooks belong to this optimizer: they hold it weakly and go when it
        is collected. on=False removes them.

        The hook is the tensor's register_post_accumulate_grad_hook where
        torch has it (2.1 and later), else a hook on its gradient
        accumulator."""
        if not on:
            if self._hooks_finalizer is not None:
                self._hooks_finalizer()
                self._hooks_finalizer = None
            self._accumulators = []
            return
        if self._hooks_finalizer is not None:
            return
        self._engine.check_step_inside_backward()
        owner_key = weakref.ref(self)
        stepped = [(name, self._tensor_of[name]) for name in self._names if self._tensor_of[name].requires_grad]
        for name, tensor in stepped:
            entry = _stepping_inside_backward.get(id(tensor))
            if entry is not None and entry[0]() is tensor and entry[1]() is not None and entry[1]() is not self:
                raise ValueError(f"parameter {name!r}: another optimizer already steps it inside backward (call "
                                 "its step_in_backward(False), or drop it, first)")
        hooks, accumulators = [], []
        try:
            for name, tensor in stepped:
                step_it = _backward_step(owner_key, name)
                if hasattr(tensor, "register_post_accumulate_grad_hook"):
                    hooks.append(tensor.register_post_accumulate_grad_hook(lambda _t, f=step_it: f()))
                else:
                    with torch.enable_grad():
                        accumulator = tensor.expand_as(tensor).grad_fn.next_functions[0][0]
                    accumulators.append(accumulator)  # a tensor holds its accumulator weakly
                    hooks.append(accumulator.register_hook(lambda *_args, f=step_it: f()))
        except BaseException:
            for h in hooks:
                h.remove()
            raise
        for _, tensor in stepped:
            _stepping_inside_backward[id(tensor)] = (weakref.ref(tensor), owner_key)
        self._accumulators = accumulators
        self._hooks_finalizer = weakref.finalize(self, _remove_backward_hooks, hooks, owner_key)

    @property
    def steps_in_backward(self):
        """Whether step_in_backward() hooks are installed."""
        return self._hooks_finalizer is not None

    def zero_grad(self, set_to_none=None):
        """As torch's zero_grad, after ending an optimizer step a step inside
        backward left open (a backward that raised part way, or a step()
        not called); last_step() then reports it."""
        self._engine.end_open_step()
        if set_to_none is None:
            super().zero_grad()
        else:
            super().zero_grad(set_to_none)

    def last_step(self):
        """A StepReport of the last step: applied, or skipped and why."""
        return StepReport(*self._engine.last_step())

    def add_param_group(self, param_group):
        if getattr(self, "_built", True):
            raise ValueError("add_param_group: this optimizer takes its parameters by name at construction, "
                             "one param group per tier")
        super().add_param_group(param_group)

    # ------------------------------------------------------------ inspection
    def state_bytes(self, tier=None):
        """Bytes of optimizer state (docs/spec.md §2), in all or in one tier."""
        if tier is None:
            return self._engine.state_bytes()
        return self._engine.tier_state_bytes(tier)

    def tier_of(self, name):
        """The tier of a registered parameter."""
        return self._engine.tier(name)

    def names(self):
        """The registered parameters' names, in registration order."""
        return list(self._names)

    def param_state(self, name):
        """{"step", "m", "v", "v_row", "v_col"}: tensors that view the
        parameter's state in place (None where its rule keeps no such array)."""
        return self._engine.param_state(name)

    def momentum(self, name):
        """The parameter's first moment, decoded to float32 in its shape, on
        the CPU (None where its rule keeps none). param_state(name)["m"] is
        the stored array: for SkewAdamBf16Momentum and SkewAdam8bit, the
        backbone's momentum as the words of its blocks."""
        return self._engine.momentum(name)

    @property
    def steps(self):
        """Steps applied so far."""
        return self._engine.steps()

    @property
    def seed(self):
        return self._engine.seed()

    # ------------------------------------------------------- save and load
    def state_dict(self):
        """The complete state, keyed by parameter name:
        {"state": {name: {"step", "m", "v", "v_row", "v_col"}},
         "param_groups": [{"tier", "lr", ..., "params": [names]}],
         "skewadam": {"format", "optimizer", "rules", "seed", "steps", "previous_grad_norm",
                      "parameters": {name: {"tier", "dtype", "shape", "rounding_stream"}}}}.
        previous_grad_norm is the norm the next step clips by under
        clip_norm="previous" (NaN: none).
        The arrays are float32 CPU copies in their logical shapes."""
        exported = self._engine.export_state()
        state, described = {}, {}
        for p in exported["params"]:
            name = p["name"]
            tensor = self._tensor_of[name]
            state[name] = {"step": p["step"], **{k: p[k] for k in STATE_ARRAYS if p[k] is not None}}
            described[name] = {"tier": self._engine.tier(name), "dtype": str(tensor.dtype).replace("torch.", ""),
                               "shape": list(tensor.shape), "rounding_stream": p["rounding_stream"]}
        groups = []
        for g in self.param_groups:
            saved = {k: v for k, v in g.items() if k != "params"}
            saved["params"] = [self._name_of[id(p)] for p in g["params"]]
            groups.append(saved)
        return {"state": state, "param_groups": groups,
                "skewadam": {"format": STATE_FORMAT, "optimizer": type(self).__name__,
                             "rules": self._engine.rules(), "seed": exported["seed"], "steps": exported["steps"],
                             "previous_grad_norm": exported["previous_grad_norm"], "parameters": described}}

    def load_state_dict(self, state_dict):
        """Loads what state_dict() returned (of an optimizer of the same class
        over parameters of the same names, tiers, dtypes and shapes). Checks
        everything first: on a mismatch it raises ValueError (TypeError for
        a malformed dict) naming what differs, and nothing changes. A
        resumed run repeats the uninterrupted one bit for bit."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict: expected a dict, got {type(state_dict).__name__}")
        for key in ("state", "param_groups", "skewadam"):
            if key not in state_dict:
                raise ValueError(f"state_dict: no '{key}' (not a skewadam state_dict)")
        meta = state_dict["skewadam"]
        if not isinstance(meta, dict) or meta.get("format") != STATE_FORMAT:
            raise ValueError(f"state_dict['skewadam']: format {meta.get('format') if isinstance(meta, dict) else meta!r}"
                             f", this version reads {STATE_FORMAT}")
        problems = []
        if meta.get("optimizer") != type(self).__name__:
            problems.append(f"saved by {meta.get('optimizer')}, loading into {type(self).__name__}")
        mine = self._engine.rules()
        saved_rules = meta.get("rules", {})
        for t in TIERS:
            if saved_rules.get(t) != mine[t]:
                problems.append(f"tier {t}: rule {saved_rules.get(t)} in the state_dict, {mine[t]} in this optimizer")
        params = meta.get("parameters", {})
        state = state_dict["state"]
        if not isinstance(params, dict) or not isinstance(state, dict):
            raise TypeError("state_dict: 'state' and 'skewadam.parameters' must be dicts keyed by parameter name")
        for name in self._names:
            if name not in params or name not in state:
                problems.append(f"parameter '{name}': not in the state_dict")
                continue
            tensor, p = self._tensor_of[name], params[name]
            want = {"tier": self._engine.tier(name), "dtype": str(tensor.dtype).replace("torch.", ""),
                    "shape": list(tensor.shape)}
            for key, value in want.items():
                if p.get(key) != value:
                    problems.append(f"parameter '{name}': {key} {p.get(key)} in the state_dict, {value} here")
        for name in params:
            if name not in self._tensor_of:
                problems.append(f"parameter '{name}': in the state_dict, not registered here")
        groups = state_dict["param_groups"]
        if not isinstance(groups, (list, tuple)) or len(groups) != len(TIERS):
            problems.append(f"param_groups: {len(groups) if isinstance(groups, (list, tuple)) else groups!r} "
                            f"groups, expected {len(TIERS)} (one per tier)")
        else:
            for g, t in zip(groups, TIERS):
                if not isinstance(g, dict) or g.get("tier") != t:
                    problems.append(f"param_groups: expected the {t} group in its place")
        if problems:
            raise ValueError("load_state_dict: " + "; ".join(problems))
        hyper = [_hyper_tuple(g, f"param_groups[{i}].") for i, g in enumerate(groups)]
        for key in ("seed", "steps"):
            v = meta.get(key)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise ValueError(f"state_dict['skewadam']['{key}']: {v!r} (expected an integer >= 0)")
        previous = meta.get("previous_grad_norm", math.nan)  # a state_dict saved before it existed: none
        if isinstance(previous, bool) or not isinstance(previous, numbers.Real):
            raise ValueError(f"state_dict['skewadam']['previous_grad_norm']: {previous!r} (expected a number)")
        entries = []
        for name in self._names:
            s, stream = state[name], params[name].get("rounding_stream")
            if not isinstance(s, dict):
                raise TypeError(f"state of '{name}': expected a dict")
            step = s.get("step")
            if isinstance(step, bool) or not isinstance(step, numbers.Integral):
                raise ValueError(f"state of '{name}': step {step!r} is not an integer")
            if isinstance(stream, bool) or not isinstance(stream, numbers.Integral) or not 0 <= stream < 2**32:
                raise ValueError(f"parameter '{name}': rounding_stream {stream!r} (expected an integer in [0, 2**32))")
            entry = {"step": int(step), "rounding_stream": int(stream)}
            for key in STATE_ARRAYS:
                entry[key] = s.get(key)
                if entry[key] is not None and not isinstance(entry[key], torch.Tensor):
                    raise TypeError(f"state of '{name}'.{key}: expected a tensor, got {type(entry[key]).__name__}")
            entries.append(entry)
        self._engine.import_state(int(meta["steps"]), int(meta["seed"]), hyper, entries,
                                  float(previous))  # all or nothing
        for group, saved in zip(self.param_groups, groups):
            for key, value in saved.items():
                if key != "params":
                    group[key] = value
        self._refresh_state()

    def __getstate__(self):
        raise TypeError(f"{type(self).__name__} cannot be pickled or copied (its state lives in the compiled "
                        "library); save and load state_dict() instead")

    # -------------------------------------------------------------- private
    def _group_hyper(self):
        if len(self.param_groups) != len(TIERS):
            raise ValueError(f"param_groups: {len(self.param_groups)} groups; this optimizer keeps exactly one per "
                             "tier and takes parameters only by name, at construction")
        out = []
        for i, (group, tier) in enumerate(zip(self.param_groups, TIERS)):
            if group.get("tier") != tier:
                raise ValueError(f"param_groups[{i}]: the {tier} group's 'tier' was changed to {group.get('tier')!r}")
            out.append(_hyper_tuple(group, f"param_groups[{i}] ({tier})."))
        return out

    def _refresh_state(self):
        """self.state: per parameter tensor, views of its state arrays."""
        self.state.clear()
        for name in self._names:
            s = self._engine.param_state(name)
            self.state[self._tensor_of[name]] = {k: s[k] for k in STATE_ARRAYS if s[k] is not None}


def _tiered(optimizer, where):
    if not isinstance(optimizer, TieredOptimizer):
        raise TypeError(f"{where}: expected a skewadam optimizer, got {type(optimizer).__name__}")
    return optimizer


def save_checkpoint(optimizer, path, include_params=False):
    """Writes the optimizer's complete state as the library's checkpoint file
    (docs/checkpoint-format.md): the file skewadam::save_checkpoint writes in
    C++ for an optimizer of the same rules over parameters of the same names,
    so a run saved here resumes in C++, and one saved in C++ resumes here
    (load_checkpoint), bit for bit. The param groups' values are saved as the
    tiers' hyperparameters. include_params also stores every parameter's
    values, bit for bit. The file is replaced atomically (a temporary file
    in the same folder, renamed over it)."""
    opt = _tiered(optimizer, "save_checkpoint")
    if not isinstance(include_params, bool):
        raise TypeError(f"include_params: expected a bool, got {type(include_params).__name__}")
    opt._engine.save_checkpoint(os.fspath(path), opt._group_hyper(), include_params)


def load_checkpoint(optimizer, path):
    """Loads a checkpoint file that save_checkpoint() or C++ wrote for the
    same parameters (by name, in any order): the state, the step count, the
    seed, the tiers' hyperparameters (into the param groups) and, where the
    file holds them, the parameter values. Everything is checked first: on a
    mismatch (or an unreadable file) it raises CheckpointError (a ValueError)
    saying what differs, and nothing changes."""
    opt = _tiered(optimizer, "load_checkpoint")
    opt._engine.load_checkpoint(os.fspath(path))
    for group, h in zip(opt.param_groups, opt._engine.hyperparameters()):
        group.update(lr=h[0], betas=(h[1], h[2]), eps=h[3], weight_decay=h[4], clip_threshold=h[5],
                     clip_scope=h[6])
    opt._refresh_state()


def _variant(name, engine, doc):
    cls = type(name, (TieredOptimizer,), {"__doc__": doc + "\n\n" + TieredOptimizer.__doc__, "_engine_type": engine})
    cls.__module__ = "skewadam"
    return cls


#: The optimizer classes, one per variant of the library's list
#: (skewadam/tiers/variants.hpp): SkewAdam, SkewAdamBf16Momentum, SkewAdam8bit, the
#: paper's ablations, AdafactorLike and AdamW.
VARIANTS = tuple(name for name, _, _ in _skewadam.variants)
globals().update({name: _variant(name, engine, doc) for name, engine, doc in _skewadam.variants})
