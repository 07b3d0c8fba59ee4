"""The gather and the all-reduce run by Python: the library's local
operations around an all-gather.

Used by a CPU Workspace over a torch.distributed process group (every call),
and by any workspace whose all_gather hook is set, for the calls that take
the UNFUSED strategy (Workspace._python_gather decides, for both). Each
rank of a gather:

1. checks its arguments (the Python checks, the gather's rules with the
   library's wording, and the library's own checks of the operation), and
   finalizes its own rows [r*L, min((r+1)*L, T)) with the library (post norm
   included) into an [L, hidden] buffer;
2. exchanges a fixed-size signature with every rank: its status, the first
   bytes of its error message, and the arguments that must agree, as the
   library's words for them (beam_gather_agreement: what its own groups
   compare; tokens, top_k, hidden, strategy, routed_scale, the norms, the
   scales, the quantized form). Its size does not depend on the arguments,
   so ranks that disagree on tokens still meet in it. If any rank failed,
   or the ranks disagree, every rank raises (the failing rank its own
   error, the others a BeamArgumentError naming that rank and its message)
   and nothing is written;
3. all-gathers the finalized rows ([R*L, hidden]: the hook, or
   torch.distributed.all_gather_into_tensor over the group), then runs the
   library's norm_residual_norm over the T gathered rows.

The result is the composition that the library's fused operation equals by
construction (docs/numerics.md), so every strategy and world size gives the
bits of the one-process fused operation.

The all-reduce (docs/numerics.md#all-reduce) is the same call with the
all-reduce's checks in step 1, where each rank's partial is of every token
([T, hidden]: the dense form's x, or the MoE form's slots finalized with
the library without the post-norm); step 3 all-gathers the partials ([R*T,
hidden]), sums them in FP32 in rank order, rounds once to BF16 as the
library does (every NaN 0x7FFF), and runs norm_residual_norm(_q) with the
norm of the sum (the dense form's pre-norm, the MoE form's post-norm): the
bits of the library's all-reduce. The collective (gather, MoE or dense
all-reduce) is the first word of the signature, so a rank's gather never
meets a peer's all-reduce: every rank raises, naming it.

The quantized form (beammoe.quant: FP8Quant, NVFP4Quant, MXFP8Quant) is
the same call with the form's checks in step 1 (the caller's, then the
library's own on zero rows: beam_moe_finalize_norm_residual_norm_q), its
form in the signature (kind, group_size and UE8M0, and the scale, which
the ranks must share as in the library's gather; where the scales lie and
whether normalized is kept are each rank's own), and step 3 through the library's
norm_residual_norm_q with the form's beam_quant: the library quantizes the
T gathered rows' normalized, so q and q_scales are the bits of the local
_fp8 operation on all the tokens, as the library's gather writes them.

The signature travels over the process group (int64 words) for a CPU
workspace over a process group, and through the hook as a [1, hidden] BF16
row (its bytes) for a library workspace with a hook.

Every exchange is in step or fails. A collective that a rank gave up (its
wait timed out) stays posted in gloo and is completed later by a late
peer's message of the same round, so each message names its round: its
kind (a creation, the creation's confirmation, a call), the workspace (a
number rank 0 draws at creation) and the call's number. A message of any
other round is a mismatch, not data. Any failure of an exchange (a timeout,
the group's error, a peer's death, a mismatch, the hook's exception, an
interrupt) leaves the workspace unusable on that rank: it never exchanges
again, so the rows of a call are sent only after every rank's signature of
that round arrived (the signature is the fence), and a peer still in the
round fails at its next exchange within timeout_ms. Creation takes two
exchanges (the signatures, then a confirmation carrying the workspace's
number), so a rank that arrives after its peers gave up, and that finds
their abandoned signatures, fails at the confirmation.
"""
import datetime
import os
import struct

import torch

from . import _calls
from . import _lib
from . import _run
from . import _checks as A
from ._errors import BeamArgumentError, BeamCommError, BeamError, raise_for_status

BF16 = torch.bfloat16
WORDS = 64  # int64 words of a signature: 19 of header, then the message
_HEAD = 19
_MSG_BYTES = (WORDS - _HEAD) * 8
_MAGIC = 0x42454D33  # "BEM3"
_FIELD0 = 5  # the header's words: magic, status, kind, workspace, call, the fields, ..., the message's length
CREATE, CONFIRM, CALL = 1, 2, 3  # the kinds of exchange (a message's round: kind, workspace, call)
_OTHER = 6  # status of a failure that is no library status (e.g. a hook's exception)

# A creation's fields: (name, ...) after (magic, status); a call's are its
# collective, then the library's agreement words (beam_gather_agreement),
# named and shown by it.
CREATE_FIELDS = ("max_tokens", "hidden_size", "moe_gather_oneshot_max_tokens", "twoshot_max_tokens", "timeout_ms")
GATHER, ALLREDUCE, DENSE = 0, 1, 2  # a call's collective: the gather, the MoE or the dense all-reduce
_COLLECTIVES = ("gather", "all-reduce", "dense all-reduce")
_NAMES = '"auto", "oneshot", "twoshot" or "unfused"'
assert _FIELD0 + max(len(CREATE_FIELDS), 1 + _run.AGREEMENT_WORDS) <= _HEAD - 1
_LOCAL = (A.FUSED + "_q:", A.FUSED + ":", A.NRN + "_q:", A.NRN + ":")  # the local operations' names


def create_field(i, v):
    return CREATE_FIELDS[i], str(v)


def call_field(i, v, dense=False):
    if i == 0:
        return "collective", _COLLECTIVES[v] if 0 <= v < len(_COLLECTIVES) else str(v)
    name, shown = _run.agreement_text(i - 1, v)
    return "pre_norm" if dense and name == "post_norm" else name, shown


def _status(e):
    if isinstance(e, BeamError):
        return e.status
    if isinstance(e, (ValueError, TypeError)):
        return 1
    return _OTHER


def pack(err, head, rnd):
    """The signature (int64 [WORDS]) of this rank: its round (kind,
    workspace, call), its status and message (from the exception `err`, or
    OK) and the header values."""
    words = [0] * WORDS
    words[0] = _MAGIC
    words[2:_FIELD0] = rnd
    if err is not None:
        words[1] = _status(err)
        msg = ("%s: %s" % (type(err).__name__, err)).encode("utf-8", "replace")[:_MSG_BYTES]
        words[_HEAD - 1] = len(msg)
        raw = msg.ljust(_MSG_BYTES, b"\0")
        words[_HEAD:] = struct.unpack("<%dq" % (WORDS - _HEAD), raw)
    else:
        words[_FIELD0:_FIELD0 + len(head)] = head
    return torch.tensor(words, dtype=torch.int64)


def _message(row):
    n = row[_HEAD - 1]
    raw = struct.pack("<%dq" % (WORDS - _HEAD), *row[_HEAD:])
    return raw[:max(0, min(n, _MSG_BYTES))].decode("utf-8", "replace")


def _round(row):
    """What a message is: its kind, workspace and call (a header's words)."""
    if row[0] != _MAGIC:
        return "no beammoe message (another collective on the group, or another beammoe version)"
    kind, ident, call = row[2:_FIELD0]
    if kind == CREATE:
        return "the signature of a workspace's creation"
    if kind == CONFIRM:
        return ("the confirmation of call %d of workspace %#x" % (call, ident) if call else
                "the confirmation of workspace %#x's creation" % ident)
    if kind == CALL:
        return "call %d of workspace %#x" % (call, ident)
    return "a message of unknown kind %d" % kind


def in_step(fn, rank, table, rnd):
    """Every rank's message (int64 [R, WORDS]) as lists, once each is of this
    round (kind, workspace, call; a creation's signature carries each rank's
    own draw for the workspace); a BeamCommError otherwise."""
    rows = table.tolist()
    for r, row in enumerate(rows):
        if row[0] != _MAGIC or row[2] != rnd[0] or (rnd[0] != CREATE and tuple(row[3:_FIELD0]) != rnd[1:]):
            raise BeamCommError("%s: rank %d sent %s where rank %d is at %s: the ranks' exchanges are out of step "
                                "(a rank gave up an earlier exchange, at a timeout, or the ranks issue collectives "
                                "on the group in different orders); nothing was written"
                                % (fn, r, _round(row), rank, _round([_MAGIC, 0] + list(rnd))), 4)
    return rows


def settle(fn, rank, rows, err, fields, n):
    """Raise on every rank when any rank failed or the ranks disagree (the
    exchanged signatures, in step); this rank's own error first. fields(i,
    v) names header field i of n and shows its value v."""
    if err is not None:
        raise err
    for r, row in enumerate(rows):
        if row[1] != 0:
            raise_for_status(row[1] if 1 <= row[1] <= 5 else _OTHER,
                             "%s: rank %d failed (%s); every rank fails and nothing was written"
                             % (fn, r, _message(row)))
    for i in range(n):
        want = rows[0][_FIELD0 + i]
        for r in range(1, len(rows)):
            got = rows[r][_FIELD0 + i]
            if got != want:
                name, shown = fields(i, want)
                raise BeamArgumentError("%s: the ranks disagree on %s: rank 0 has %s, rank %d has %s (every rank "
                                        "must pass the same %s); nothing was written"
                                        % (fn, name, shown, r, fields(i, got)[1],
                                           ", ".join(fields(j, 0)[0] for j in range(n))))


def _wait(work, fn, rank, timeout_ms):
    """Wait for a collective over the group, at most timeout_ms. A wait that
    times out leaves the collective posted (gloo cannot take it back): the
    caller never exchanges on that workspace again."""
    try:
        done = work.wait(timeout=datetime.timedelta(milliseconds=timeout_ms))
    except RuntimeError as e:
        raise BeamCommError("%s: rank %d: the collective over the process group failed or a peer did not arrive "
                            "within timeout_ms=%d: %s" % (fn, rank, timeout_ms, e), 4) from e
    if done is False:
        raise BeamCommError("%s: rank %d: a peer did not arrive within timeout_ms=%d" % (fn, rank, timeout_ms), 4)


def draw():
    """A rank's draw for a new workspace's number (rank 0's is taken)."""
    return int.from_bytes(os.urandom(8), "little") >> 2


def exchange(ws, fn, err, head, rnd, timeout_ms=None):
    """Every rank's signature of this round (pack's arguments), checked to
    be in step (in_step): rows of int64 words."""
    sig = pack(err, head, rnd)
    R = ws.world_size
    if ws._pg:
        import torch.distributed as dist

        outs = [torch.empty_like(sig) for _ in range(R)]
        work = dist.all_gather(outs, sig, group=ws.device_group, async_op=True)
        _wait(work, fn, ws.rank, timeout_ms if timeout_ms is not None else ws.timeout_ms)
        return in_step(fn, ws.rank, torch.stack(outs), rnd)
    # A library workspace with the hook: its bytes as a BF16 row of hidden_size
    # columns (>= 256, so >= 512 bytes), gathered by the hook.
    row = torch.zeros(1, ws.hidden_size, dtype=torch.int16)
    row[0, :WORDS * 4] = sig.view(torch.int16)
    out = torch.empty(R, ws.hidden_size, dtype=BF16, device=ws.device)
    ws._all_gather(out, row.view(BF16).to(ws.device))
    return in_step(fn, ws.rank, out.cpu().view(torch.int16)[:, :WORDS * 4].contiguous().view(torch.int64), rnd)


_into_tensor = [True]  # the group takes all_gather_into_tensor (gloo of torch < 2.1 does not)


def _all_gather_rows(ws, fn, out, inp):
    """out [R*L, hidden] = every rank's inp [L, hidden], in rank order."""
    hook = ws._all_gather
    if hook is not None:
        hook(out, inp)
        return
    import torch.distributed as dist

    group = ws.device_group
    out, inp = out.view(torch.uint8), inp.view(torch.uint8)  # the bytes (gloo of torch 1.13 has no BF16, no int16)
    if _into_tensor[0] and hasattr(dist, "all_gather_into_tensor"):
        try:
            work = dist.all_gather_into_tensor(out, inp, group=group, async_op=True)
        except RuntimeError as e:  # refused on the spot, on every rank alike
            if "support" not in str(e):
                raise
            _into_tensor[0] = False
        else:
            _wait(work, fn, ws.rank, ws.timeout_ms)
            return
    work = dist.all_gather(list(out.view(ws.world_size, -1, out.shape[1]).unbind(0)), inp, group=group,
                           async_op=True)
    _wait(work, fn, ws.rank, ws.timeout_ms)


def _gather_rules(fn, ws, st, tokens, hidden, capacity):
    """The gather's own rules (lib/api.c's wording); the strategy AUTO takes.
    capacity None: the all-reduce's (check_fused saw that x covers every token)."""
    if st not in (0, 2, 3, 4):
        if st == 1:
            raise BeamArgumentError("%s: strategy=FUSED: unknown strategy for this operation (use AUTO, ONESHOT, "
                                    "TWOSHOT or UNFUSED)" % fn)
        raise BeamArgumentError("%s: strategy=%d: unknown strategy" % (fn, st))
    if tokens > ws.max_tokens:
        raise BeamArgumentError("%s: tokens=%d must be <= max_tokens=%d of the workspace"
                                % (fn, tokens, ws.max_tokens))
    if hidden != ws.hidden_size:
        raise BeamArgumentError("%s: hidden=%d must equal hidden=%d of the workspace" % (fn, hidden, ws.hidden_size))
    per = -(-tokens // ws.world_size)
    if capacity is not None and capacity < per:
        raise BeamArgumentError("%s: capacity=%d must be >= ceil(tokens / ranks) = %d (tokens=%d, ranks=%d)"
                                % (fn, capacity, per, tokens, ws.world_size))
    return st if st else ws._auto_enum(tokens)


def _library_rules(fn, dev, g, w, capacity, top_k, hidden, scale, pw, pe, residual, s, nw, ne, quant, keep):
    """The library's checks of the operation (top_k, hidden, eps, scales,
    routed_scale, pointers; with quant, a beam_quant, the quantized form's
    encoding): its local operation on zero rows (g None: the dense
    all-reduce's, norm_residual_norm with pw, pe its pre-norm; else the fused
    operation), with the collective's name in the message."""
    empty = torch.empty(0, dtype=BF16, device=dev)
    n = empty if (keep if quant is not None else ne is not None) else None
    try:
        if g is None:
            _run.norm_residual_norm(dev, empty, residual, 0, hidden, pw, pe, s, nw, ne, empty, n, quant)
        else:
            _run.fused(dev, g, w, capacity, 0, top_k, hidden, scale, pw, pe, residual, s, nw, ne, empty, n, 0, quant)
    except BeamArgumentError as e:
        msg = str(e)
        for name in _LOCAL:
            if msg.startswith(name):
                raise BeamArgumentError(fn + msg[len(name) - 1:]) from None
        raise


def gather(ws, fn, *args, **kw):
    """The gather or the all-reduce in Python (_gather) on the workspace
    `ws`, held for the call: a call that overlaps another on the same
    workspace (another thread's, or one made from inside the hook), or on a
    workspace that an earlier failure left unusable, is refused before
    anything is checked, exchanged or written (Workspace._held)."""
    with ws._held(fn):
        return _gather(ws, fn, *args, **kw)


def _strategy(fn, strategy):
    return strategy if type(strategy) is int else A.strategy(fn, strategy, _lib.STRATEGIES, _NAMES)


def reduce_ranks(parts):
    """The all-reduce's sum of the partials [R, T, hidden] BF16: FP32 in rank
    order, one rounding to BF16 (round-to-nearest-even, as torch rounds),
    every NaN 0x7FFF as the library's bm_bf16 makes it."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc += p.float()
    out = acc.bfloat16()
    out.view(torch.int16)[acc.isnan()] = 0x7FFF
    return out


def _gather(ws, fn, x, residual, pw, pe, nw, ne, scales, routed_scale, strategy, inplace, op=False, quant=None,
            keep_normalized=False, coll=GATHER):
    """The gather of ops.beam_moe_finalize_gather_norm_residual_norm in
    Python, or with coll ALLREDUCE the MoE all-reduce's (x of every token,
    (pw, pe) the post-norm of the sum), with coll DENSE the dense one's (x
    the [T, hidden] partial, (pw, pe) the pre-norm; routed_scale unused).
    Eager (op=False): the function's own arguments; returns (hidden,
    normalized | None), refusing a backward pass where autograd records.
    op=True (the torch operator's implementation): an MoE x is (gemm2,
    weights), strategy the library's value; returns (hidden, normalized |
    None) with hidden = residual when inplace. ws is a Workspace (both
    callers hold one).

    quant: None, or the quantized form of beammoe.fp8 as a callable
    quant(next_eps) that checks the form's own arguments (keep_normalized
    among them) and returns its beam_quant fields (kind, group_size, flags,
    scale); q and q_scales are made as _run.empty_outputs makes them, and the call
    returns (hidden, normalized | None, q, q_scales), normalized only where
    keep_normalized. Its results carry no autograd record, as the local
    quantized calls' (an in-place write is refused while autograd records
    on a leaf)."""
    rank, R = ws.rank, ws.world_size
    err = None
    head = ()
    qst = None
    try:
        if coll == DENSE:
            tokens, hidden, pw, pe, nw, ne, s = A.check_nrn(fn, x, residual, pw, pe, nw, ne, scales)
            st, g, w, capacity, top_k, scale = _strategy(fn, strategy), None, None, 0, 0, 1.0
            tensors, names = (x, residual, pw, nw), A.NRN_NAMES
        else:
            g, w = x if op else A.moe_output(fn, x)
            capacity, top_k, hidden, pw, pe, nw, ne, s, scale, st = A.check_fused(
                fn, g, w, residual, pw, pe, nw, ne, scales, routed_scale, _strategy(fn, strategy),
                gather=coll == GATHER)
            tensors, names = (g, w, residual, pw, nw), A.FUSED_NAMES
        qf = quant(ne) if quant is not None else None
        A.flag(fn, "inplace", inplace)
        dev, _, recording = _calls.route(fn, names, tensors)
        ws._handle_for(fn, dev)
        recording = recording and not op
        if inplace:
            _calls.no_autograd_write(fn, "residual", residual, recording, True)
        tokens = residual.shape[0]
        st = _gather_rules(fn, ws, st, tokens, hidden, capacity if coll == GATHER else None)
        if qf is not None:
            # the outputs first (as the library's gather allocates before the
            # ranks agree): the library checks the form's struct below
            with torch.no_grad():
                out = residual if inplace else torch.empty_like(residual)
                normalized = torch.empty_like(residual) if keep_normalized else None
                q, qs = _run.empty_outputs(qf[0], qf[1], qf[2], qf[3], tokens, hidden, dev)
            qst = _run.struct(qf[0], qf[1], qf[2], qf[3], q, qs)
        _library_rules(fn, dev, g, w, capacity, top_k, hidden, scale, pw, pe, residual, s, nw, ne, qst,
                       keep_normalized)
        # the rows this rank sends: the gather's own tokens, finalized with
        # the post-norm; the all-reduce's partial of every token (the MoE
        # form's finalized without it: the sum's norm)
        per = owned = tokens
        if coll == GATHER:
            per = -(-tokens // R)
            owned = min(max(tokens - rank * per, 0), per)
        fin = x.detach() if coll == DENSE else torch.empty(per, hidden, dtype=BF16, device=dev)
        if owned < per:
            fin[owned:].zero_()  # padding rows: sent, never read
        if coll != DENSE:
            post = (pw, pe) if coll == GATHER else (None, None)
            _run.finalize(dev, g, w, capacity, owned, top_k, hidden, scale, *post, fin)
        head = (coll,) + _run.agreement(tokens, top_k, hidden, scale, pw, pe, s, nw, ne, qf, st)
    except Exception as e:  # carried to every rank below
        err = e
    ws._call_no += 1
    call = (CALL, ws._ident, ws._call_no)
    settle(fn, rank, ws._collective(lambda: exchange(ws, fn, err, head, call)), err,
           lambda i, v: call_field(i, v, coll == DENSE), 1 + _run.AGREEMENT_WORDS)

    def compute(h, n):
        # The round's second exchange: the rows, or with no rows its
        # confirmation, so that a rank that reaches a round its peers gave
        # up fails in it.
        if tokens == 0:
            ws._collective(lambda: exchange(ws, fn, None, (), (CONFIRM,) + call[1:]))
            return
        rows = torch.empty(R * per, hidden, dtype=BF16, device=dev)
        ws._collective(lambda: _all_gather_rows(ws, fn, rows, fin))
        pre = (None, None)
        if coll != GATHER:  # the sum, and its norm
            rows, pre = reduce_ranks(rows.view(R, per, hidden)), (pw, pe)
        # with qst, the library quantizes the normalized rows
        _run.norm_residual_norm(dev, rows, residual, tokens, hidden, *pre, s, nw, ne, h, n, qst)

    if qst is not None:
        compute(out, normalized)
        if inplace and not op:
            _calls.increment_versions((residual,))  # written behind torch's back, as fp8.py's local calls do
        return out, normalized, q, qs
    if op:
        normalized = torch.empty_like(residual) if ne is not None else None
        out = residual if inplace else torch.empty_like(residual)
        compute(out, normalized)
        return out, normalized
    return _calls.run_eager(fn, residual, inplace, ne, tensors, compute, recording)
