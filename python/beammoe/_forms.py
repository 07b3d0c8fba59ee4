"""The quantized forms of normalized, as the C library lists them.

lib/quant_forms.def has one line a form, BM_FORM(kind, qf, bits, group,
scale, blocks) (its comment says what each field means). The library's
checks, kernels and CPU loops follow from it, and so do the package's
layouts (_run.empty_outputs, _run.struct): a row of values is hidden * bits
/ 8 bytes; blocks 0: FP32 scales (`scales`), one per group of `group`
values (0: the caller's group_size, -1: the whole row), or none written
where the caller gives the scale (scale 1); blocks 1: one byte per group of
`group` values (`block_scales`), BEAM_BLOCK_SCALE_BYTES(tokens, hidden /
group) of them: the tokens rounded up to 128 rows of hidden / group, the
128 x 4 tiles.

The list is read once, where the first quantized call (or the first form's
fields) asks for it, from beammoe/_libs/quant_forms.def (python/setup.py
copies it there, beside the libraries) or else from the source tree the
package lies in (python/beammoe -> ../../lib/quant_forms.def); without
either, that call raises a RuntimeError naming both.
"""
import os
import re
from collections import namedtuple

# enum beam_quant_kind of beammoe.h, for the forms the package exposes; a
# line of any other kind is passed over
FP8_GROUP, FP8_TOKEN, FP8_TENSOR, NVFP4, MXFP8 = 1, 2, 3, 4, 5
KINDS = {"BEAM_QUANT_FP8_GROUP": FP8_GROUP, "BEAM_QUANT_FP8_TOKEN": FP8_TOKEN,
         "BEAM_QUANT_FP8_TENSOR": FP8_TENSOR, "BEAM_QUANT_NVFP4": NVFP4, "BEAM_QUANT_MXFP8": MXFP8}
# the fields' codes (the list's comment)
ROW = -1  # group: the whole row (0: the caller's group_size)
STATIC, GLOBAL, E8M0 = 1, 2, 3  # scale: the caller's static or global scale; computed, E8M0 codes (0: computed)

HERE = os.path.dirname(os.path.abspath(__file__))
PLACES = (os.path.join(HERE, "_libs", "quant_forms.def"),
          os.path.join(os.path.dirname(os.path.dirname(HERE)), "lib", "quant_forms.def"))

Form = namedtuple("Form", "kind name qf bits group scale blocks")
_LINE = re.compile(r"^BM_FORM\(\s*(\w+)\s*,\s*(\w+)" + r"\s*,\s*(-?\d+)" * 4 + r"\s*\)", re.M)
_table = None
_path = None


def _name(ident):
    """The form's name in messages: BEAM_QUANT_FP8_GROUP -> "FP8 group"."""
    words = ident[len("BEAM_QUANT_"):].split("_")
    return " ".join(words[:1] + [w.lower() for w in words[1:]])


def read(path):
    """{kind: Form} of the list at `path`: its lines of the kinds the package knows."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = {}
    for ident, qf, bits, group, scale, blocks in _LINE.findall(text):
        if ident in KINDS:
            out[KINDS[ident]] = Form(KINDS[ident], _name(ident), qf, int(bits), int(group), int(scale), int(blocks))
    return out


def table():
    """{kind: Form}, read on first use (PLACES, in order)."""
    global _table, _path
    if _table is None:
        path = next((p for p in PLACES if os.path.exists(p)), None)
        if path is None:
            raise RuntimeError("beammoe: the list of quantized forms, quant_forms.def, is in neither %s (where "
                               "`pip install ./python` puts it) nor %s (a source tree): install the package from "
                               "the source tree" % PLACES)
        _path = path
        _table = read(path)
    return _table


try:  # now, not at a first use inside a torch.compile trace (which cannot stat a file)
    table()
except RuntimeError:
    pass  # said again at the first use


def form(kind):
    """The Form of beam_quant kind `kind`; a ValueError for a kind the list lacks."""
    f = (_table or table()).get(kind)
    if f is None:
        raise ValueError("quant kind=%r is none of the forms of %s (%s)" % (
            kind, _path, ", ".join("%d: %s" % (k, v.name) for k, v in sorted(_table.items()))))
    return f


def name(kind):
    """The form's name ("FP8 group", "NVFP4"), or "kind N" for another."""
    try:
        f = table().get(kind)
    except RuntimeError:
        f = None
    return f.name if f is not None else "kind %d" % kind
