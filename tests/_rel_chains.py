"""Reliability engine, part 2: input pools, leaves and the random chain generator (ChainGen)."""
from __future__ import annotations

import itertools
import math
import operator

import torch
import torch.nn.functional as F
from _rel_ops import (  # noqa: F401
    BF16,
    F16,
    F32,
    FLOATS,
    I32,
    LIMIT,
    MAX_SLOTS,
    POOL_N,
    T,
    _abs_iv,
    _binary_factory,
    _clamp_tensor_iv,
    _mag,
    _meets,
    _mono,
    _numel,
    _reduce_factory,
    _scalar_factory,
    _scale_iv,
    _sig,
    _softplus,
    _unary_table,
)


# ================================================================================================ pools and leaves
class Pools:
    """Random input data on one device, never written: leaves are views of slices of these (cloned where a chain
    writes them). Floats uniform in [-2, 2] (fp16/bf16: the fp32 values rounded), int32 in [-8, 8]."""

    def __init__(self, device, seed=0, n=POOL_N):
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        f = torch.rand(n, generator=g, device=device) * 4.0 - 2.0
        self.device = device
        self.n = n
        self.t = {F32: f, F16: f.half(), BF16: f.bfloat16(),
                  I32: torch.randint(-8, 9, (n,), generator=g, device=device, dtype=I32)}
        self.iv = {F32: (-2.0, 2.0), F16: (-2.0, 2.0), BF16: (-2.0, 2.0), I32: (-8.0, 8.0)}

    def ensure(self, n):
        """Grow (the data followed by itself reversed) until a leaf of n elements fits: a broadcast or matmul can
        ask for a leaf larger than the pool (a 1,000,000-op soak did). Chains are generated and replayed on the
        same Pools object, and a rebuilt chain grows its fresh pools the same way."""
        while self.n < n:
            self.t = {dt: torch.cat([t, t.flip(0)]) for dt, t in self.t.items()}
            self.n *= 2


# leaf layouts: how a leaf of shape S is a view of a base tensor
def _layout_base(shape, layout):
    """(base shape, view function) of a leaf of `shape` with `layout`."""
    s = tuple(shape)
    if layout == "t":
        return s[:-2] + (s[-1], s[-2]), (lambda b: b.transpose(-1, -2))
    if layout == "step":
        return s[:-1] + (2 * s[-1],), (lambda b: b[..., ::2])
    if layout == "slice":
        return (s[0] + 1,) + s[1:], (lambda b: b[1:])
    if layout == "permute":
        nd = len(s)
        return tuple(reversed(s)), (lambda b: b.permute(*reversed(range(nd))))
    if isinstance(layout, tuple) and layout[0] == "expand":
        base = tuple(1 if i in layout[1] else d for i, d in enumerate(s))
        return base, (lambda b: b.expand(*s))
    return s, None


def _make_leaf(pools, spec, mode, written):
    dt, off, base, view = spec
    b = pools.t[dt][off:off + _numel(base)]
    if mode == "f64":
        b = b.double() if dt.is_floating_point else b.clone()
    elif mode == "eager" or written:
        b = b.clone()
    b = b.view(base)
    return view(b) if view is not None else b


# ================================================================================================ programs
LEAF, CALL, ALLOC, CAST = 0, 1, 2, 3


class Chain:
    """A generated program: instructions over MAX_SLOTS slots, replayable in three modes (eager on clones of the
    leaves, gpuos under a scheduler context, float64)."""

    __slots__ = ("prog", "labels", "leaves", "written", "n_ops", "dtype", "seed", "slots")

    def __init__(self, prog, labels, leaves, written, n_ops, dtype, seed, slots):
        self.prog, self.labels, self.leaves, self.written = prog, labels, leaves, written
        self.n_ops, self.dtype, self.seed, self.slots = n_ops, dtype, seed, slots


def make_leaves(chain, pools, mode):
    """The chain's input tensors for a replay in `mode` (made before a scheduler context is entered, so the replay
    under it runs the chain's ops only)."""
    return [_make_leaf(pools, spec, mode, w) for spec, w in zip(chain.leaves, chain.written)]


def _exec(ins, env, leaves, dev, f64):
    """One instruction on the slots."""
    op = ins[0]
    if op == CALL:
        r = ins[2](*[env[i] for i in ins[3]])
        if ins[1] >= 0:
            if f64 and isinstance(r, torch.Tensor) and r.dtype.is_floating_point and r.dtype != torch.float64:
                r = r.double()  # a float made from ints (int / int, sigmoid(int)): float32 by default
            env[ins[1]] = r
    elif op == LEAF:
        env[ins[1]] = leaves[ins[2]]
    elif op == ALLOC:
        shape, dt, transposed = ins[2], ins[3], ins[4]
        if f64 and dt.is_floating_point:
            dt = torch.float64
        if transposed:
            env[ins[1]] = torch.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=dt, device=dev).transpose(-1, -2)
        else:
            env[ins[1]] = torch.empty(shape, dtype=dt, device=dev)
    else:  # CAST (a copy in every mode: in float64 a float->float cast would otherwise alias its source)
        dt = ins[3]
        if f64 and dt.is_floating_point:
            dt = torch.float64
        env[ins[1]] = env[ins[2]].to(dt, copy=True)


def run_chain(chain, pools, mode, leaves=None, capture=None):
    """Execute `chain` ('eager': every leaf cloned; 'gpuos': only leaves the chain writes are cloned -- the caller
    enters the scheduler context; 'f64': floats as float64). leaves: from make_leaves (made here if None).
    capture: a list that gets (index, output cloned) per instruction. Returns the slots."""
    env = [None] * chain.slots
    if leaves is None:
        leaves = make_leaves(chain, pools, mode)
    dev, f64 = pools.device, mode == "f64"
    for k, ins in enumerate(chain.prog):
        if ins[0] == CALL and not f64:  # the hot path, inline
            r = ins[2](*[env[i] for i in ins[3]])
            if ins[1] >= 0:
                env[ins[1]] = r
        else:
            _exec(ins, env, leaves, dev, f64)
        if capture is not None:
            v = env[ins[1]] if ins[1] >= 0 else None
            capture.append((k, v.clone() if isinstance(v, torch.Tensor) else v))
    return env


class ChainGen:
    """Builds a Chain while running it eagerly (an op eager rejects is not recorded), tracking per slot an interval
    that bounds its values, a storage key (views and in-place writes share it) and whether its values are exact
    (identical in every replay: leaves, and ints/bools derived from exact values only -- the only inputs of
    discontinuous ops such as comparisons and float->int casts)."""

    def __init__(self, pools):
        self.pools = pools
        self.dev = pools.device
        self.rejected = 0  # ops eager raised for (dropped)

    # ---------------------------------------------------------------- slots
    def _reset(self, rng):
        self.r = rng
        self.env = [None] * MAX_SLOTS
        self.iv = [None] * MAX_SLOTS
        self.key = [0] * MAX_SLOTS
        self.exact = [False] * MAX_SLOTS
        self.cls = [0] * MAX_SLOTS      # 0 empty, 1 float, 2 int, 3 bool (cached: the generator's hot path)
        self.shape = [None] * MAX_SLOTS
        self.key_leaf = {}
        self.next_key = 1
        self.prog, self.labels, self.leaves, self.written = [], [], [], []
        self.nops = 0

    def _numeric(self):
        """Live slots holding float or int values."""
        return [i for i, k in enumerate(self.cls) if k == 1 or k == 2]

    def _pick(self):
        c = self._numeric()
        return self.r.choice(c) if c else -1

    def _slot_for(self, exclude=()):
        free = [i for i in range(MAX_SLOTS) if self.env[i] is None]
        if free:
            return free[0]
        c = [i for i in range(MAX_SLOTS) if i not in exclude]
        return self.r.choice(c)

    def _newkey(self):
        self.next_key += 1
        return self.next_key

    def _set(self, dst, t, iv, key, exact):
        self.env[dst], self.iv[dst], self.key[dst], self.exact[dst] = t, iv, key, exact
        dt = t.dtype
        self.cls[dst] = 1 if dt.is_floating_point else 3 if dt == torch.bool else 2
        self.shape[dst] = tuple(t.shape)

    # ---------------------------------------------------------------- recording
    def _emit(self, fn, srcs, dst, label, iv, exact=False, inplace=False, view=False):
        """Run fn on the slots eagerly; on success record it and set dst's metadata. Returns dst, or -1 (rejected)."""
        try:
            t = fn(*[self.env[i] for i in srcs])
        except Exception:  # noqa: BLE001 -- eager rejects this combination: not part of the chain
            self.rejected += 1
            return -1
        self.prog.append((CALL, dst, fn, tuple(srcs)))
        self.labels.append(label)
        self.nops += 1
        if dst < 0:
            return dst
        if inplace:
            self._written(dst, iv)
        elif view:
            s = srcs[0]
            self._set(dst, t, self.iv[s], self.key[s], self.exact[s])
        else:
            if not isinstance(t, torch.Tensor):
                raise AssertionError(f"{label} returned {type(t).__name__}")
            self._set(dst, t, iv, self._newkey(), exact)
        return dst

    def _written(self, dst, iv):
        """dst's storage was written: dst takes iv, every other view of that storage the union."""
        k = self.key[dst]
        for i in range(MAX_SLOTS):
            if self.env[i] is not None and self.key[i] == k:
                self.exact[i] = False
                if i != dst:
                    self.iv[i] = (min(self.iv[i][0], iv[0]), max(self.iv[i][1], iv[1]))
        self.iv[dst] = iv
        if k in self.key_leaf:
            self.written[self.key_leaf[k]] = True

    def _leaf(self, shape, dtype, layout=None, exclude=()):
        r = self.r
        shape = tuple(shape)
        if layout is None:
            layout = "c"
            x = r.random()
            nd = len(shape)
            if nd >= 2 and x < 0.12:
                layout = "t"
            elif nd >= 1 and x < 0.22:
                layout = "step"
            elif nd >= 1 and x < 0.30:
                layout = "slice"
            elif nd >= 3 and x < 0.36:
                layout = "permute"
            elif x < 0.42:
                dims = [i for i, d in enumerate(shape) if d > 1 and r.random() < 0.5]
                if dims:
                    layout = ("expand", tuple(dims))
        base, view = _layout_base(shape, layout)
        n = _numel(base)
        self.pools.ensure(n)
        off = r.randrange(0, self.pools.n - n + 1)
        idx = len(self.leaves)
        self.leaves.append((dtype, off, base, view))
        self.written.append(False)
        dst = self._slot_for(exclude)
        t = _make_leaf(self.pools, self.leaves[idx], "eager", False)
        self.prog.append((LEAF, dst, idx))
        self.labels.append(f"leaf{idx}({layout if isinstance(layout, str) else 'expand'})")
        key = self._newkey()
        self.key_leaf[key] = idx
        self._set(dst, t, self.pools.iv[dtype], key, True)
        return dst

    # ---------------------------------------------------------------- guards (themselves ops of the chain)
    def _squash(self, s, c):
        """Make |slot s| <= c (overwrites the slot with the squashed value)."""
        iv = self.iv[s]
        m = _mag(iv)
        if m <= c:
            return True
        t = self.env[s]
        r = self.r
        if not t.dtype.is_floating_point:
            ci = max(1, int(c))
            return self._emit(lambda x: torch.clamp(x, -ci, ci), (s,), s, f"clamp({-ci},{ci})",
                              (max(iv[0], -ci), min(iv[1], ci))) >= 0
        k = r.random()
        if k < 0.35:
            e = math.ceil(math.log2(m / c))
            f = 2.0 ** -e  # exact scaling in every float dtype
            return self._emit(lambda x: x * f, (s,), s, f"mul.Scalar({f})", _scale_iv(iv, f)) >= 0
        if k < 0.55:
            if self._emit(torch.tanh, (s,), s, "tanh", _mono(math.tanh)(iv)) < 0:
                return False
            return self._squash(s, c)
        if k < 0.8:
            return self._emit(lambda x: torch.clamp(x, -c, c), (s,), s, f"clamp({-c},{c})",
                              (max(iv[0], -c), min(iv[1], c))) >= 0
        return self._emit(lambda x: F.hardtanh(x, -c, c), (s,), s, f"hardtanh({-c},{c})",
                          (max(iv[0], -c), min(iv[1], c))) >= 0

    def _posify(self, s, m, cap=None):
        """Make slot s >= m (and <= cap)."""
        if cap is not None and not self._squash(s, max(cap - 1.0, 0.5)):
            return False
        iv = self.iv[s]
        if iv[0] >= m:
            return True
        t = self.env[s]
        r = self.r
        if not t.dtype.is_floating_point:
            if self._emit(torch.abs, (s,), s, "abs", _abs_iv(iv)) < 0:
                return False
            mi = int(math.ceil(m))
            a = self.iv[s]
            return self._emit(lambda x: x + mi, (s,), s, f"add.Scalar({mi})", (a[0] + mi, a[1] + mi)) >= 0
        k = r.random()
        if k < 0.4:
            if self._emit(r.choice([torch.abs, T.abs]), (s,), s, "abs", _abs_iv(iv)) < 0:
                return False
        elif k < 0.6:
            if self._emit(torch.sigmoid, (s,), s, "sigmoid", _mono(_sig)(iv)) < 0:
                return False
        elif k < 0.8:
            if self._emit(F.relu, (s,), s, "relu", (max(iv[0], 0.0), max(iv[1], 0.0))) < 0:
                return False
        else:
            if self._emit(lambda x: F.softplus(x), (s,), s, "softplus(1.0,20.0)",
                          _mono(_softplus(1.0, 20.0))(iv)) < 0:
                return False
        a = self.iv[s]
        add = m + max(0.0, -a[0])
        add = float(math.ceil(add * 4.0) / 4.0)  # a multiple of 1/4: exact in every dtype
        return self._emit(lambda x: x + add, (s,), s, f"add.Scalar({add})", (a[0] + add, a[1] + add)) >= 0

    def _require(self, s, req):
        if req is None or _meets(self.iv[s], req):
            return True
        k = req[0]
        if k == "bound":
            ok = self._squash(s, req[1])
        elif k == "pos":
            ok = self._posify(s, req[1])
        elif k == "posb":
            ok = self._posify(s, req[1], cap=req[2])
        else:  # nz
            ok = self._posify(s, req[1])
            if ok and self.r.random() < 0.4:
                a = self.iv[s]
                ok = self._emit(torch.neg, (s,), s, "neg", (-a[1], -a[0])) >= 0
        return ok and _meets(self.iv[s], req)

    # ---------------------------------------------------------------- partners
    def _partner_shape(self, shape, inplace):
        r = self.r
        s = tuple(shape)
        x = r.random()
        if x < 0.45 or not s:
            return s if x > 0.08 or not s else ()
        if x < 0.55:
            return ()
        if x < 0.9:
            k = r.randint(0, len(s) - 1)
            return tuple(1 if r.random() < 0.3 else d for d in s[k:])
        if not inplace and _numel(s) * 3 <= 12288:
            return (r.choice([2, 3]),) + s
        return s

    def _partner(self, x, inplace=False, exclude=()):
        """A slot broadcast-compatible with x (an existing one, or a new leaf; never evicting x or `exclude`)."""
        r = self.r
        xs = self.shape[x]
        if r.random() < 0.3:
            c = [i for i in self._numeric() if i != x and _bcast_ok(xs, self.shape[i], inplace)]
            if c:
                return r.choice(c)
        dt = self.env[x].dtype
        if dt not in self.pools.t:  # bool, int64 (an int sum)
            dt = F32 if dt == torch.bool or dt.is_floating_point else I32
        if r.random() < 0.12:
            dt = r.choice(FLOATS + (I32,))
        return self._leaf(self._partner_shape(xs, inplace), dt, exclude=(x,) + tuple(exclude))

    # ---------------------------------------------------------------- steps
    def _form(self, has_ip, has_out):
        x = self.r.random()
        if has_ip and x < 0.22:
            return "i"
        if has_out and x > 0.86:
            return "o"
        return "f"

    def _apply(self, label, fns, ip, out, ivf, srcs, lock_dst=False):
        """Record one op over srcs in a random form (functional into a new slot or over its first input, in-place on
        its first input, out= into a new tensor or over its first input)."""
        r = self.r
        ivs = [self.iv[s] for s in srcs]
        iv = ivf(*ivs)
        if _mag(iv) > LIMIT:
            for s in srcs:
                if not self._squash(s, 1.0):
                    return -1
            iv = ivf(*[self.iv[s] for s in srcs])
            if _mag(iv) > LIMIT:
                return -1
        form = self._form(ip is not None, out is not None)
        x = srcs[0]
        if form == "i":
            return self._emit(ip, srcs, x, label + "_", iv, inplace=True)
        if form == "o":
            return self._out(out, fns[0], srcs, label + ".out", iv)
        dst = x if (r.random() < 0.5 and not lock_dst) else self._slot_for(exclude=srcs)
        return self._emit(r.choice(fns), srcs, dst, label, iv)

    def _out(self, out, probe, srcs, label, iv):
        r = self.r
        vals = [self.env[i] for i in srcs]
        try:
            p = probe(*vals)
        except Exception:  # noqa: BLE001
            self.rejected += 1
            return -1
        if p.dtype.is_floating_point and not any(self.env[i].dtype.is_floating_point for i in srcs):
            return -1  # int inputs, float out=: the float64 replay's float64 out= is refused by some kernels
        x = srcs[0]
        xt = self.env[x]
        if r.random() < 0.25 and tuple(xt.shape) == tuple(p.shape) and xt.dtype == p.dtype and _writable(xt):
            return self._emit(out, tuple(srcs) + (x,), x, label + "[out=input]", iv, inplace=True)
        dt = p.dtype
        if dt.is_floating_point and r.random() < 0.15:
            dt = r.choice(FLOATS)
        # (not for gelu: CPU torch 2.13's aten.gelu.out writes zeros into a transposed out -- eager is the reference)
        transposed = p.dim() >= 2 and r.random() < 0.2 and not label.startswith("gelu")
        shape = tuple(p.shape)
        if transposed:
            o = torch.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=dt, device=self.dev).transpose(-1, -2)
        else:
            o = torch.empty(shape, dtype=dt, device=self.dev)
        try:
            out(*vals, o)
        except Exception:  # noqa: BLE001 -- the ALLOC is not recorded either (never an uninitialised slot)
            self.rejected += 1
            return -1
        dst = self._slot_for(exclude=srcs)
        self.prog.append((ALLOC, dst, shape, dt, transposed))
        self.labels.append(f"empty({list(shape)},{str(dt).replace('torch.', '')}{',t' if transposed else ''})")
        self._set(dst, o, (0.0, 0.0), self._newkey(), False)
        self.prog.append((CALL, dst, out, tuple(srcs) + (dst,)))
        self.labels.append(label)
        self.nops += 1
        self._written(dst, iv)
        return dst

    def _one_input(self, draw):
        """A one-input op: draw() -> (label, f, inplace, out, interval fn, requirements) on a picked slot."""
        x = self._pick()
        if x < 0:
            return
        label, f, ip, out, ivf, reqs = draw()
        if not self._require(x, reqs[0]):
            return
        self._apply(label, f, ip, out, ivf, (x,))

    def _step_unary(self):
        fns, cw = _unary_table()
        self._one_input(lambda: self.r.choices(fns, cum_weights=cw)[0](self.r))

    def _step_scalar(self):
        self._one_input(lambda: _scalar_factory(self.r))

    def _step_binary(self):
        x = self._pick()
        if x < 0:
            return
        label, f, ip, out, ivf, reqs = _binary_factory(self.r)
        inplace_ok = ip is not None and _writable(self.env[x])
        y = self._partner(x, inplace=inplace_ok)
        if y == x:
            return
        if self.r.random() < 0.15:  # operands swapped: the partner broadcasts up, or it is 0-d
            x, y = y, x
        if not self._require(x, reqs[0]) or not self._require(y, reqs[1]) or not _meets(self.iv[x], reqs[0] or
                                                                                          ("bound", math.inf)):
            return
        self._apply(label, f, ip if _writable(self.env[x]) else None, out, ivf, (x, y))

    def _step_clamp_tensor(self):
        x = self._pick()
        if x < 0:
            return
        lo = self._partner(x, inplace=True)
        hi = self._partner(x, inplace=True, exclude=(lo,))
        if len({x, lo, hi}) < 3:
            return
        fns = [lambda a, b, c: torch.clamp(a, b, c), lambda a, b, c: a.clamp(b, c),
               lambda a, b, c: torch.clamp(a, min=b, max=c)]
        ip = (lambda a, b, c: a.clamp_(b, c)) if _writable(self.env[x]) else None
        self._apply("clamp.Tensor", fns, ip, lambda a, b, c, o: torch.clamp(a, b, c, out=o), _clamp_tensor_iv,
                    (x, lo, hi))

    def _step_reduce(self):
        x = self._pick()
        if x < 0:
            return
        t = self.env[x]
        n = t.shape[-1] if t.dim() else 1
        label, fns, out, ivf = _reduce_factory(self.r, n)
        if label.startswith("sum") and n * _mag(self.iv[x]) > LIMIT:
            m = _mag(self.iv[x])
            if t.dtype.is_floating_point:
                e = math.ceil(math.log2(max(n * m / LIMIT, 1.0)))
                f = 2.0 ** -e
                if self._emit(lambda v: v * f, (x,), x, f"mul.Scalar({f})", _scale_iv(self.iv[x], f)) < 0:
                    return
            elif not self._squash(x, max(1.0, LIMIT / max(n, 1))):
                return
        iv = ivf(self.iv[x])
        if _mag(iv) > LIMIT:
            if not self._squash(x, 1.0):
                return
            iv = ivf(self.iv[x])
        r = self.r
        if out is not None and r.random() < 0.1:
            self._out(out, fns[0], (x,), label + ".out", iv)
            return
        dst = x if r.random() < 0.5 else self._slot_for(exclude=(x,))
        self._emit(r.choice(fns), (x,), dst, label, iv)

    def _exact_mask(self, x):
        """A bool slot computed from exact values, broadcastable with x."""
        xs = self.shape[x]
        c = [i for i in self._numeric() if self.exact[i] and _bcast_ok(xs, self.shape[i], False)]
        e = self.r.choice(c) if c else self._leaf(self._partner_shape(xs, True), self.r.choice(FLOATS + (I32,)),
                                                  exclude=(x,))
        thr = self.r.choice([0.0, 0.5, -1.0])
        m = self._slot_for(exclude=(x, e))
        return self._emit(lambda v: v > thr, (e,), m, f"gt.Scalar({thr})", (0.0, 1.0), exact=True)

    def _step_foreign(self):
        r = self.r
        k = r.random()
        x = self._pick()
        if x < 0:
            return
        t = self.env[x]
        if k < 0.3:  # where(mask, x, y)
            m = self._exact_mask(x)
            if m < 0:
                return
            y = self._partner(x, exclude=(m,))
            if len({m, x, y}) < 3:
                return
            a, b = self.iv[x], self.iv[y]
            dst = self._slot_for(exclude=(m, x, y))
            self._emit(torch.where, (m, x, y), dst, "where.self", (min(a[0], b[0]), max(a[1], b[1])))
        elif k < 0.55:  # casts
            dst = self._slot_for(exclude=(x,)) if r.random() < 0.5 else x
            if t.dtype.is_floating_point:
                if self.exact[x] and r.random() < 0.3:
                    dt, exact = I32, True
                else:
                    dt, exact = r.choice([d for d in FLOATS if d != t.dtype]), False
            else:
                dt, exact = r.choice(FLOATS), self.exact[x]
            iv = self.iv[x]
            if dt == I32:
                iv = (math.floor(iv[0]), math.ceil(iv[1]))
            self.prog.append((CAST, dst, x, dt))
            self.labels.append(f"to({str(dt).replace('torch.', '')})")
            self.nops += 1
            self._set(dst, t.to(dt), iv, self._newkey(), exact)
        elif k < 0.65:  # copies (contiguous() aliases or copies depending on the layout: leaves only)
            fn = T.contiguous if self.key[x] in self.key_leaf and r.random() < 0.5 else T.clone
            self._emit(fn, (x,), self._slot_for(exclude=(x,)), fn.__name__, self.iv[x], exact=self.exact[x])
        elif k < 0.75:  # cumsum (eager, reads deferred work)
            n = t.shape[-1] if t.dim() else 1
            if not t.dtype.is_floating_point or not self._squash(x, max(LIMIT / max(n, 1), 2.0 ** -6)):
                return
            iv = self.iv[x]
            self._emit(lambda v: torch.cumsum(v, -1), (x,), self._slot_for(exclude=(x,)), "cumsum",
                       (min(iv[0], n * iv[0]), max(iv[1], n * iv[1])))
        elif k < 0.88:  # matmul (a heavy op: the worker yields)
            if t.dim() != 2 or not t.dtype.is_floating_point or t.shape[1] == 0:
                return
            c = t.shape[1]
            w = self._leaf((c, r.choice([1, 16, 64])), t.dtype, layout=r.choice(["c", "t"]), exclude=(x,))
            if not self._squash(x, max(LIMIT / (2.0 * c), 2.0 ** -8)):
                return
            m = _mag(self.iv[x]) * 2.0 * c
            self._emit(operator.matmul, (x, w), self._slot_for(exclude=(x, w)), "mm", (-m, m))
        elif k < 0.94:  # a host read (flushes the deferred work it depends on, syncs)
            if t.numel() == 0:
                return
            self._emit(lambda v: v.reshape(-1)[0].item(), (x,), -1, "item", None)
        else:  # an explicit gpuos flush in the middle of a context
            self._emit(_gpuos_flush, (), -1, "gpuos.flush()", None)

    def _step_view(self):
        r = self.r
        x = self._pick()
        if x < 0:
            return
        t = self.env[x]
        c = [("unsqueeze(0)", lambda v: v.unsqueeze(0))]
        if self.key[x] in self.key_leaf:  # reshape aliases or copies depending on the layout: only where every
            c.append(("reshape(-1)", lambda v: v.reshape(-1)))  # replay has the same one (leaves and their views)
        if t.dim() >= 2:
            c += [("transpose(-1,-2)", lambda v: v.transpose(-1, -2)), ("t()", lambda v: v.transpose(-1, -2))]
        if t.dim() >= 1 and t.shape[-1] >= 2:
            c.append(("[...,::2]", lambda v: v[..., ::2]))
        if t.dim() >= 1 and t.shape[0] >= 2:
            c.append(("[1:]", lambda v: v[1:]))
        ones = [i for i, d in enumerate(t.shape) if d == 1]
        if ones:
            shape = tuple(3 if i == ones[0] else d for i, d in enumerate(t.shape))
            c.append((f"expand{list(shape)}", lambda v: v.expand(*shape)))
        label, fn = r.choice(c)
        self._emit(fn, (x,), self._slot_for(exclude=(x,)), label, None, view=True)

    def _step_leaf(self):
        x = self._pick()
        if x < 0:
            self._leaf(_rand_shape(self.r), self.main)
            return
        self._partner(x)

    def build(self, rng, n_ops, dtype=None, shape=None, seed=None):
        """Generate a chain of about n_ops ops; returns (Chain, eager slots)."""
        self._reset(rng)
        r = rng
        if dtype is None:
            x = r.random()
            dtype = F32 if x < 0.45 else F16 if x < 0.67 else BF16 if x < 0.9 else I32
        self.main = dtype
        shape = _rand_shape(r) if shape is None else shape
        self._leaf(shape, dtype)
        if r.random() < 0.5:
            self._partner(0)
        steps = (self._step_unary, self._step_scalar, self._step_binary, self._step_clamp_tensor,
                 self._step_reduce, self._step_foreign, self._step_view, self._step_leaf)
        cw = _STEP_CUM
        tries = 0
        while self.nops < n_ops and tries < 4 * n_ops + 20:
            tries += 1
            r.choices(steps, cum_weights=cw)[0]()
        chain = Chain(self.prog, self.labels, self.leaves, self.written, self.nops, dtype, seed, MAX_SLOTS)
        return chain, self.env


#: weights of unary, Tensor-Scalar, binary, clamp.Tensor, reduction, foreign, view and new-leaf steps
_STEP_CUM = list(itertools.accumulate((30, 14, 22, 2, 9, 8, 6, 3)))


def _gpuos_flush():
    import gpuos_ext
    if gpuos_ext.is_initialized():
        gpuos_ext.flush()


def _writable(t) -> bool:
    """False for tensors whose elements overlap (expanded): in-place ops on them raise in eager."""
    return all(st != 0 or d <= 1 for st, d in zip(t.stride(), t.shape))


def _bcast_ok(target, other, inplace) -> bool:
    """other broadcasts with target (inplace: to exactly target's shape)."""
    if len(other) > len(target):
        return False if inplace else _bcast_ok(other, target, False)
    for a, b in zip(reversed(target), reversed(other)):
        if a != b and b != 1 and (inplace or a != 1):
            return False
    return True


_SHAPES = [(4096,), (1000,), (257,), (64,), (7,), (1,), (64, 64), (32, 128), (16, 256), (8, 100), (33, 65),
           (3, 1000), (128, 32), (1, 512), (512, 1), (2, 3, 64), (4, 8, 16), (3, 1, 50), (2, 2, 3, 4, 5),
           (2, 16, 2, 16), (5, 7, 9)]
_RARE = [(), (0,), (4, 0), (0, 16), (256, 160)]  # 0-d, numel 0, and one above the scheduler's size threshold


def _rand_shape(r):
    return r.choice(_RARE) if r.random() < 0.03 else r.choice(_SHAPES)
