"""audit_file: the Python equivalent of `beammoe audit --input FILE.safetensors`.

A safetensors file holds one problem with the tensor names and metadata keys
of docs/safetensors.md (the C tool's harness/st_case.c): `residual`
present means the fused op finalize_norm_residual_norm, absent means
finalize. The file is read and checked completely before anything runs (a
ValueError naming the file and the fault, as the C tool's exit status 2);
then the CPU backend's FUSED call is the ground truth, and every available
backend and strategy (and, for the fused op, the CPU-group gather over two
threads) is compared with it bit for bit, as are the results stored in the
file (`output`, `hidden`, `normalized`). A mismatch or a library error is a
row of the report (the C tool's exit status 1).

The file is read by _safetensors.py (the C tool's reader, rule and words;
why not the `safetensors` package is said there).
"""
import os
import re
import threading
import time

import torch

from . import _lib
from ._run import library_rules
from ._errors import BeamUnsupportedError
from ._safetensors import _escape, _meta_f32, _meta_pair, _shape_text, _torch, read_safetensors
from .ops import (MoEOutput, beam_moe_finalize, beam_moe_finalize_gather_norm_residual_norm,
                  beam_moe_finalize_norm_residual_norm)
from .workspace import CpuGroup, Workspace

__all__ = ["AuditReport", "AuditRow", "audit_file", "read_safetensors"]

_KNOWN = ("expert_outputs", "expert_weights", "residual", "post_norm_weight", "next_norm_weight",
          "output", "hidden", "normalized")


class _Problem:
    """The file as one call: op, sizes, tensors, norms, stored results."""


def _load(tensors, meta, data):
    """The checks of harness/st_case.c (load_case), in its order."""
    def get(name, dtype, ndim, want):
        t = tensors.get(name)
        if t is None:
            return None
        if t.dtype != dtype:
            raise ValueError("tensor '%s' has dtype %s, expected %s %s" % (name, t.dtype, dtype, want))
        if ndim and len(t.shape) != ndim:
            raise ValueError("tensor '%s' has shape %s, expected %s" % (name, _shape_text(t.shape), want))
        return t

    ex = get("expert_outputs", "BF16", 0, "[capacity, top_k, hidden]")
    if ex is None:
        raise ValueError("missing tensor 'expert_outputs' (BF16 [capacity, top_k, hidden])")
    wt = get("expert_weights", "F32", 2, "[capacity, top_k]")
    if wt is None:
        raise ValueError("missing tensor 'expert_weights' (F32 [capacity, top_k])")
    C, K = wt.shape
    if len(ex.shape) == 3:
        if ex.shape[0] != C or ex.shape[1] != K:
            raise ValueError("tensor 'expert_outputs' has shape %s, but 'expert_weights' [%d, %d] says "
                             "[capacity, top_k, hidden] = [%d, %d, hidden]"
                             % (_shape_text(ex.shape), C, K, C, K))
        H = ex.shape[2]
    elif len(ex.shape) == 2:
        if K == 0 or ex.shape[0] // K != C or ex.shape[0] % K != 0:
            raise ValueError("tensor 'expert_outputs' has shape %s, but 'expert_weights' [%d, %d] says "
                             "[capacity * top_k, hidden] = [%d, hidden]"
                             % (_shape_text(ex.shape), C, K, C * K))
        H = ex.shape[1]
    else:
        raise ValueError("tensor 'expert_outputs' has shape %s, expected [capacity, top_k, hidden] or "
                         "[capacity * top_k, hidden]" % _shape_text(ex.shape))
    _probe_library(K, H)

    res = get("residual", "BF16", 2, "[tokens, hidden]")
    pw = get("post_norm_weight", "BF16", 1, "[hidden]")
    nw = get("next_norm_weight", "BF16", 1, "[hidden]")
    for t in (pw, nw):
        if t is not None and t.shape[0] != H:
            raise ValueError("tensor '%s' has shape %s, expected [hidden] = [%d]"
                             % (t.name, _shape_text(t.shape), H))
    if res is not None and res.shape[1] != H:
        raise ValueError("tensor 'residual' has shape %s, expected [tokens, hidden = %d]"
                         % (_shape_text(res.shape), H))

    rs = _meta_f32(meta, "routed_scale")
    peps = _meta_f32(meta, "post_eps")
    neps = _meta_f32(meta, "next_eps")
    sc = _meta_pair(meta, "scales")
    lt = meta.get("live_tokens")
    if lt is not None:
        if not re.fullmatch(r"[ \t\n\r\f\v]*[+-]?[0-9]+", lt) or not 0 <= int(lt) <= C:
            raise ValueError("metadata live_tokens=\"%s\" must be an integer in [0, capacity = %d]"
                             % (_escape(lt, 40), C))
        T = int(lt)
    else:
        T = min(res.shape[0], C) if res is not None else C
    if res is not None and res.shape[0] < T:
        raise ValueError("tensor 'residual' has %d rows, fewer than live_tokens = %d" % (res.shape[0], T))
    if res is None and (nw is not None or neps is not None or sc is not None):
        what = ("tensor 'next_norm_weight'" if nw is not None else
                "metadata next_eps" if neps is not None else "metadata scales")
        raise ValueError("%s needs tensor 'residual' (the fused op); without it the file is a finalize "
                         "problem" % what)

    out = get("output", "BF16", 2, "[live_tokens, hidden]")
    hid = get("hidden", "BF16", 2, "[live_tokens, hidden]")
    nrm = get("normalized", "BF16", 2, "[live_tokens, hidden]")
    for t in (out, hid, nrm):
        if t is not None and t.shape != (T, H):
            raise ValueError("tensor '%s' has shape %s, expected [live_tokens, hidden] = [%d, %d]"
                             % (t.name, _shape_text(t.shape), T, H))
    if res is not None and out is not None:
        raise ValueError("tensor 'output' is the finalize result; with 'residual' (fused op) the results "
                         "are 'hidden' and 'normalized'")
    if res is None and (hid is not None or nrm is not None):
        raise ValueError("tensor '%s' is a fused-op result, but the file has no 'residual'"
                         % ("hidden" if hid is not None else "normalized"))
    if nrm is not None and nw is None and neps is None:
        raise ValueError("tensor 'normalized' is given, but no next norm (next_norm_weight or next_eps)")

    p = _Problem()
    p.notes = ["tensor '%s' is not used" % _escape(n) for n in tensors if n not in _KNOWN]
    p.fused = res is not None
    p.T, p.C, p.K, p.H = T, C, K, H
    p.routed_scale = 1.0 if rs is None else rs
    p.scales = sc
    p.post_eps = (1e-6 if peps is None else peps) if (pw is not None or peps is not None) else None
    p.next_eps = (1e-6 if neps is None else neps) if (nw is not None or neps is not None) else None
    p.experts = _torch(ex, data).reshape(C * K, H)
    p.weights = _torch(wt, data)
    p.post_w = _torch(pw, data) if pw is not None else None
    p.next_w = _torch(nw, data) if nw is not None else None
    p.residual = _torch(res, data)[:T].clone() if res is not None else None
    p.stored = [(t.name, _torch(t, data)) for t in (out, hid, nrm) if t is not None]
    return p


def _probe_library(K, H):
    """The library's rules for top_k and hidden before anything is sized
    from them: a call with no rows checks them and writes nothing."""
    if K > 2**31 - 1 or H > 2**31 - 1:
        raise ValueError("top_k=%d, hidden=%d: out of the 32-bit range" % (K, H))
    bad = library_rules(K, H)
    if bad is not None:
        raise ValueError("the library rejects this shape: %s: %s"
                         % (_lib.library().beam_status_string(bad[0]).decode(), bad[1]))


# ---- comparison ----

def _ordered(b):
    """bf16 bit patterns (int32) on one increasing integer line."""
    mag = b & 0x7FFF
    return torch.where((b & 0x8000) != 0, -mag, mag)


def _compare(got, want):
    """(compared, mismatched, max ulp or "nan") of two BF16 tensors, as
    harness/util.c's hu_cmp_add: NaN vs NaN counts as a mismatch of 0 ULP
    (but +0 vs -0 is 0 ULP here, 1 there)."""
    g = got.detach().cpu().contiguous().view(torch.int16).to(torch.int32).reshape(-1) & 0xFFFF
    w = want.detach().cpu().contiguous().view(torch.int16).to(torch.int32).reshape(-1) & 0xFFFF
    diff = g != w
    n_mis = int(diff.sum())
    if not n_mis:
        return g.numel(), 0, 0
    g, w = g[diff], w[diff]
    gn = ((g & 0x7F80) == 0x7F80) & ((g & 0x7F) != 0)
    wn = ((w & 0x7F80) == 0x7F80) & ((w & 0x7F) != 0)
    if bool((gn != wn).any()):
        return got.numel(), n_mis, "nan"
    both = ~(gn | wn)
    ulp = int((_ordered(g[both]) - _ordered(w[both])).abs().max()) if bool(both.any()) else 0
    return got.numel(), n_mis, ulp


class AuditRow:
    """One line of the table: a mismatch count, or an error message."""
    __slots__ = ("case", "backend", "strategy", "compared", "mismatches", "max_ulp", "error")

    def __init__(self, case, backend, strategy, compared=0, mismatches=0, max_ulp=0, error=None):
        self.case, self.backend, self.strategy = case, backend, strategy
        self.compared, self.mismatches, self.max_ulp, self.error = compared, mismatches, max_ulp, error

    @property
    def ok(self):
        return self.error is None and self.mismatches == 0

    def __repr__(self):
        return "AuditRow(%r, %r, %r, compared=%d, mismatches=%d, max_ulp=%r%s)" % (
            self.case, self.backend, self.strategy, self.compared, self.mismatches, self.max_ulp,
            ", error=%r" % self.error if self.error else "")


class AuditReport:
    """The rows of one file's audit; .ok is True when no row mismatches or fails."""

    def __init__(self, path, label, rows, notes=(), seconds=0.0):
        self.path, self.label, self.rows, self.notes, self.seconds = path, label, rows, list(notes), seconds

    @property
    def ok(self):
        return all(r.ok for r in self.rows)

    @property
    def compared(self):
        return sum(r.compared for r in self.rows)

    @property
    def mismatches(self):
        return sum(r.mismatches for r in self.rows)

    @property
    def errors(self):
        return sum(1 for r in self.rows if r.error is not None)

    def __str__(self):
        lines = ["beammoe audit (python): library %s, input %s" % (_lib.version(), _escape(os.fsdecode(self.path))),
                 "",
                 "%-56s %-7s %-18s %11s %10s %7s" % ("case", "backend", "strategy", "compared", "mismatch",
                                                    "maxulp")]
        for r in self.rows:
            if r.error is not None:
                lines.append("%-56s %-7s %-18s %11s %10s %7s  <-- ERROR\n      %s"
                             % (r.case, r.backend, r.strategy, "-", "ERROR", "-", r.error))
            else:
                lines.append("%-56s %-7s %-18s %11d %10d %7s%s"
                             % (r.case, r.backend, r.strategy, r.compared, r.mismatches, r.max_ulp,
                                "  <-- MISMATCH" if r.mismatches else ""))
        bad = sum(1 for r in self.rows if r.mismatches)
        lines += ["", "summary: 1 file, %d rows, %d elements compared, %d mismatching in %d rows, %d errors, "
                  "%.1f s: %s" % (len(self.rows), self.compared, self.mismatches, bad, self.errors,
                                  self.seconds, "PASS" if self.ok else "FAIL")]
        return "\n".join(lines)

    def __repr__(self):
        return "AuditReport(%r, rows=%d, ok=%r)" % (self.path, len(self.rows), self.ok)


# ---- running the calls ----

def _run(p, dev, strategy):
    """The file's call on device `dev`; the results (CPU tensors) in the
    order of the ground truth: (output,) or (hidden[, normalized])."""
    def on(t):
        return None if t is None else t.to(dev)
    x = MoEOutput(on(p.experts), on(p.weights), p.T)
    if not p.fused:
        out = torch.empty(p.T, p.H, dtype=torch.bfloat16, device=dev)
        beam_moe_finalize(x.gemm2_permuted, x.expert_weights, out, p.routed_scale, on(p.post_w), p.post_eps)
        res = (out,)
    else:
        h, n = beam_moe_finalize_norm_residual_norm(x, on(p.residual).clone(), on(p.post_w), p.post_eps,
                                                    on(p.next_w), p.next_eps, p.scales, p.routed_scale,
                                                    strategy=strategy)
        res = (h,) if n is None else (h, n)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return tuple(t.cpu() for t in res)


def _run_gather(p, nranks, strategy):
    """The CPU-group gather over `nranks` threads: every rank's results."""
    per = -(-p.T // nranks) if p.T else 0
    g3 = p.experts.view(p.C, p.K, p.H)
    results, errors = [None] * nranks, []
    with CpuGroup(nranks) as grp:
        def body(r):
            try:
                with Workspace.cpu(grp, r, max(p.T, 1), p.H, timeout_ms=60000) as ws:
                    lo, hi = min(r * per, p.T), min((r + 1) * per, p.T)
                    # capacity ceil(T / R) on every rank; rows past the
                    # owned ones are NaN that must never be read
                    lg = torch.full((per, p.K, p.H), float("nan"), dtype=torch.bfloat16)
                    lw = torch.full((per, p.K), float("nan"))
                    lg[: hi - lo] = g3[lo:hi]
                    lw[: hi - lo] = p.weights[lo:hi]
                    lg = lg.view(per * p.K, p.H)
                    h, n = beam_moe_finalize_gather_norm_residual_norm(
                        MoEOutput(lg, lw), p.residual.clone(), p.post_w, p.post_eps, p.next_w, p.next_eps,
                        p.scales, ws, p.routed_scale, strategy=strategy)
                    results[r] = (h,) if n is None else (h, n)
            except BaseException as e:  # reported by the calling thread
                errors.append((r, e))
        ts = [threading.Thread(target=body, args=(r,)) for r in range(nranks)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    if errors:
        r, e = errors[0]
        raise RuntimeError("rank %d: %s" % (r, e))
    return [t for res in results for t in res]


def _cuda_usable():
    """None when the CUDA backend can run torch CUDA tensors here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    try:
        _lib.backend_ops("cuda")
    except Exception as e:  # BeamError: the backend does not load
        return "libbeammoe's CUDA backend does not run here: %s" % e
    return None


def _backends(backends):
    if backends is None or backends == "all":
        return None
    if isinstance(backends, str):
        backends = [backends]
    out = []
    for b in backends:
        if b not in ("cpu", "cuda"):
            raise ValueError("audit_file: backends: unknown backend %r (use \"cpu\", \"cuda\" or None)" % (b,))
        out.append(b)
    return out


def audit_file(path, backends=None):
    """Audit the problem in the safetensors file `path`; an AuditReport.

    backends: None or "all" (the CPU, and CUDA when torch sees a GPU and the
    library's CUDA backend loads), or "cpu"/"cuda" or a list of them (a
    backend asked for by name that cannot run is an error row). Raises
    ValueError for a file that cannot be used (missing names, wrong dtypes
    or shapes, truncated, bad JSON, arguments the library rejects); a
    BeamError when the ground truth's CPU call fails otherwise (e.g. out of
    memory)."""
    want = _backends(backends)
    shown = _escape(os.fsdecode(path))  # a file name may hold escape sequences too
    try:
        tensors, meta, data = read_safetensors(path)
        p = _load(tensors, meta, data)
    except ValueError as e:
        raise ValueError("%s: %s" % (shown, e)) from None

    # ground truth: the CPU backend's call; a rule it breaks is the file's fault
    try:
        truth = _run(p, torch.device("cpu"), "fused")
    except (ValueError, BeamUnsupportedError) as e:
        st = getattr(e, "status", _lib.BEAM_ERR_INVALID_ARGUMENT)
        raise ValueError("%s: the library rejects these tensors: %s: %s"
                         % (shown, _lib.library().beam_status_string(st).decode(), e)) from None

    opts = ""
    if p.post_eps is not None:
        opts += "post:w " if p.post_w is not None else "post "
    if p.next_eps is not None:
        opts += "next:w " if p.next_w is not None else "next "
    if p.scales is not None:
        opts += "sc "
    rest = "%s T%d K%d H%d c%d %srs%s" % ("fused" if p.fused else "finalize", p.T, p.K, p.H, p.C, opts,
                                         "%g" % p.routed_scale)
    room = max(56 - 2 - len(rest), 4)
    label = "%s: %s" % (_escape(os.path.basename(os.fsdecode(path)), room), rest)

    rows = []
    t0 = time.time()

    def row(backend, strategy, fn):
        try:
            got = fn()
        except Exception as e:  # a library error is a row, not the end of the audit
            rows.append(AuditRow(label, backend, strategy, error="%s: %s" % (type(e).__name__, e)))
            return
        comp = mis = 0
        ulp = 0
        for g, w in zip(got, truth * (len(got) // len(truth))):
            c, m, u = _compare(g, w)
            comp, mis = comp + c, mis + m
            ulp = "nan" if "nan" in (u, ulp) else max(ulp, u)
        rows.append(AuditRow(label, backend, strategy, comp, mis, ulp))

    strategies = (None, "fused", "unfused") if p.fused else ("plain",)
    for b in ("cpu", "cuda"):
        if want is not None and b not in want:
            continue
        if b == "cuda":
            why = _cuda_usable()
            if why is not None:
                if want is not None:
                    rows.append(AuditRow(label, "cuda", "-", error=why))
                continue
        dev = torch.device("cpu") if b == "cpu" else torch.device("cuda", torch.cuda.current_device())
        for s in strategies:
            row(b, s or "auto", lambda s=s, dev=dev: _run(p, dev, None if s == "plain" else s))
        if b == "cpu" and p.fused:
            for s in (None, "oneshot", "twoshot", "unfused"):
                row("cpu", "gather/%s R2" % (s or "auto"), lambda s=s: _run_gather(p, 2, s))
    for name, t in p.stored:
        want_t = {"output": 0, "hidden": 0, "normalized": 1}[name]
        c, m, u = _compare(t, truth[want_t])
        rows.append(AuditRow(label, "file", "stored:%s" % name, c, m, u))
    return AuditReport(path, label, rows, p.notes, time.time() - t0)
