"""beammoe.audit_file and `python3 -m beammoe audit`: the audit of a
safetensors file (docs/safetensors.md), against files written by a tiny
writer here and by the C tool's `beammoe run --output`, and agreeing with
the C tool's `beammoe audit --input` on pass/fail."""
import ctypes
import importlib
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time

import pytest
import torch

import beammoe
from reference import BF16, random_bf16, random_case

_here = os.path.dirname(os.path.abspath(__file__))
_pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(beammoe.__file__)))  # the package under test


def save_file(path, tensors, metadata=None, header_edit=None, tail=b""):
    """The safetensors writer of docs/safetensors.md (struct + json);
    header_edit(header) may break the header, tail is appended."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        dtype = {torch.bfloat16: "BF16", torch.float32: "F32"}[t.dtype]
        raw = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())  # little-endian host, no NumPy
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if header_edit is not None:
        header_edit(header)
    js = json.dumps(header).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + b"".join(blobs) + tail)
    return path


def fused_case(gen, tokens=6, top_k=4, hidden=256, with_results=True):
    """Tensors and metadata of a fused problem, results from the library."""
    g, w = random_case(gen, tokens, top_k, hidden, specials=True)
    residual = random_bf16(gen, tokens, hidden, scale=2.0)
    pw, nw = random_bf16(gen, hidden), random_bf16(gen, hidden)
    t = {"expert_outputs": g, "expert_weights": w, "residual": residual, "post_norm_weight": pw,
         "next_norm_weight": nw}
    meta = {"routed_scale": "1.5", "post_eps": "1e-6", "next_eps": "1e-5", "scales": "0.5,2",
            "live_tokens": str(tokens)}
    if with_results:
        h, n = beammoe.beam_moe_finalize_norm_residual_norm(
            beammoe.MoEOutput(g, w, tokens), residual.clone(), pw, 1e-6, nw, 1e-5, (0.5, 2.0), 1.5)
        t["hidden"], t["normalized"] = h, n
    return t, meta


def finalize_case(gen, tokens=5, top_k=2, hidden=512):
    g, w = random_case(gen, tokens + 2, top_k, hidden)  # capacity > live tokens
    pw = random_bf16(gen, hidden)
    out = torch.empty(tokens, hidden, dtype=BF16)
    beammoe.beam_moe_finalize(g, w, out, 0.75, pw, 1e-6)
    t = {"expert_outputs": g.view(tokens + 2, top_k, hidden), "expert_weights": w, "post_norm_weight": pw,
         "output": out}
    return t, {"routed_scale": "0.75", "live_tokens": str(tokens)}


def tool_path():
    """tools/beammoe of the build tree the library comes from, or None."""
    libdir = os.path.dirname(os.path.realpath(beammoe.library_path()))
    for top in (os.path.dirname(libdir), libdir):  # .libs/ -> top dir
        p = os.path.join(top, "tools", "beammoe")
        if os.access(p, os.X_OK):
            return p
    return None


def tool_or_skip():
    tool = tool_path()
    if tool is None:
        pytest.skip("tools/beammoe not found next to %s" % beammoe.library_path())
    return tool


def cli(path, *extra):
    """`python3 -m beammoe audit path` in a child: (exit status, output)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = _pkg_root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("BEAMMOE_LIBRARY", beammoe.library_path())
    r = subprocess.run([sys.executable, "-m", "beammoe", "audit", str(path), "--backend", "cpu"] + list(extra),
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                       timeout=300)
    return r.returncode, r.stdout


def c_audit(tool, path):
    r = subprocess.run([tool, "audit", "--input", str(path), "--quick"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    if r.returncode == 2 and "without json-c" in r.stdout:
        pytest.skip("tools/beammoe was built without json-c")
    return r.returncode, r.stdout


def flip_bit(path, name, index=3):
    """Flip the lowest bit of element `index` of tensor `name` in place."""
    with open(path, "r+b") as f:
        hlen = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(hlen))
        pos = 8 + hlen + hdr[name]["data_offsets"][0] + 2 * index
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 1]))


# ---- good files ----

def test_fused_file_passes(gen, tmp_path):
    t, meta = fused_case(gen)
    rep = beammoe.audit_file(save_file(tmp_path / "f.safetensors", t, meta), backends="cpu")
    assert rep.ok, str(rep)
    strategies = [(r.backend, r.strategy) for r in rep.rows]
    for want in [("cpu", "auto"), ("cpu", "fused"), ("cpu", "unfused"), ("cpu", "gather/oneshot R2"),
                 ("cpu", "gather/twoshot R2"), ("file", "stored:hidden"), ("file", "stored:normalized")]:
        assert want in strategies
    assert all(r.compared > 0 and r.mismatches == 0 for r in rep.rows)
    text = str(rep)
    assert "PASS" in text and "stored:normalized" in text and "fused T6 K4 H256" in text


def test_finalize_file_passes(gen, tmp_path):
    t, meta = finalize_case(gen)
    rep = beammoe.audit_file(save_file(tmp_path / "f.safetensors", t, meta))
    assert rep.ok, str(rep)
    assert [(r.backend, r.strategy) for r in rep.rows if r.backend != "cuda"] == [
        ("cpu", "plain"), ("file", "stored:output")]
    assert "finalize T5 K2 H512 c7 post:w rs0.75" in rep.label


def test_minimal_file_and_unused_note(gen, tmp_path):
    """Only the two required tensors: finalize, no norm; an extra name is a note."""
    g, w = random_case(gen, 3, 2, 256)
    path = save_file(tmp_path / "m.safetensors", {"expert_outputs": g, "expert_weights": w,
                                                  "extra": torch.zeros(2)})
    rep = beammoe.audit_file(path, backends=["cpu"])
    assert rep.ok
    assert rep.notes == ["tensor 'extra' is not used"]


def test_empty_live_tokens(gen, tmp_path):
    t, meta = fused_case(gen, with_results=False)
    meta["live_tokens"] = "0"
    t["residual"] = t["residual"][:0]
    assert beammoe.audit_file(save_file(tmp_path / "e.safetensors", t, meta), "cpu").ok


# ---- the command line, and agreement with the C tool ----

def test_cli_exit_status(gen, tmp_path):
    t, meta = fused_case(gen)
    path = save_file(tmp_path / "c.safetensors", t, meta)
    rc, out = cli(path)
    assert rc == 0, out
    assert "summary:" in out and "PASS" in out
    flip_bit(path, "hidden")
    rc, out = cli(path)
    assert rc == 1, out
    assert "MISMATCH" in out and "FAIL" in out
    bad = save_file(tmp_path / "bad.safetensors", {"expert_weights": t["expert_weights"]})
    rc, out = cli(bad)
    assert rc == 2 and "missing tensor 'expert_outputs'" in out
    rc, out = cli(tmp_path / "nonexistent.safetensors")
    assert rc == 2 and "cannot open" in out


def test_c_tool_round_trip(tmp_path):
    """Files of `beammoe run --output`: the Python audit passes them, the C
    audit agrees, and both fail on a flipped stored bit."""
    tool = tool_or_skip()
    cases = [("fused.safetensors", ["--tokens", "9", "--top-k", "8", "--hidden", "512", "--post-norm",
                                    "--next-norm", "--scales", "0.5,2"], "hidden"),
             ("fin.safetensors", ["--op", "finalize", "--tokens", "5", "--top-k", "4", "--hidden", "256",
                                  "--post-norm"], "output")]
    for name, args, stored in cases:
        path = tmp_path / name
        r = subprocess.run([tool, "run"] + args + ["--output", str(path)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
        if r.returncode == 2 and "without json-c" in r.stdout:
            pytest.skip("tools/beammoe was built without json-c")
        assert r.returncode == 0, r.stdout
        rep = beammoe.audit_file(str(path), "cpu")
        assert rep.ok, str(rep)
        assert ("file", "stored:%s" % stored) in [(x.backend, x.strategy) for x in rep.rows]
        assert c_audit(tool, path)[0] == 0
        assert cli(path)[0] == 0
        flip_bit(path, stored, index=7)
        rep = beammoe.audit_file(str(path), "cpu")
        assert not rep.ok
        bad = [x for x in rep.rows if not x.ok]
        assert [(x.strategy, x.mismatches, x.max_ulp) for x in bad] == [("stored:%s" % stored, 1, 1)]
        assert c_audit(tool, path)[0] == 1
        assert cli(path)[0] == 1


def test_c_tool_agrees_on_malformed(gen, tmp_path):
    tool = tool_or_skip()
    t, meta = fused_case(gen)
    del t["expert_weights"]
    path = save_file(tmp_path / "m.safetensors", t, meta)
    rc_c, out_c = c_audit(tool, path)
    rc_py, out_py = cli(path)
    assert rc_c == rc_py == 2, (out_c, out_py)
    assert "missing tensor 'expert_weights'" in out_c and "missing tensor 'expert_weights'" in out_py


# ---- bad files: ValueError with the fault's words ----

def _drop(name):
    def edit(h):
        del h[name]
    return edit


def _set(name, key, value):
    def edit(h):
        h[name][key] = value
    return edit


@pytest.mark.parametrize("change, words", [
    (dict(tensors=lambda t: t.pop("expert_outputs")), "missing tensor 'expert_outputs'"),
    (dict(header_edit=_drop("expert_outputs")),  # its bytes stay: a gap
     r"bad data_offsets: bytes \[0, 12288\) of the data belong to no tensor"),
    (dict(tensors=lambda t: t.update(expert_weights=t["expert_weights"].to(BF16))),
     "tensor 'expert_weights' has dtype BF16, expected F32"),
    (dict(tensors=lambda t: t.update(residual=t["residual"][:, :128].contiguous())),
     r"tensor 'residual' has shape \[6, 128\], expected \[tokens, hidden = 256\]"),
    (dict(tensors=lambda t: t.update(residual=t["residual"][:3].contiguous())),
     "tensor 'residual' has 3 rows, fewer than live_tokens = 6"),
    (dict(tensors=lambda t: t.update(expert_outputs=t["expert_outputs"].view(-1))),
     "tensor 'expert_outputs' has shape \\[6144\\], expected"),
    (dict(tensors=lambda t: t.update(expert_outputs=t["expert_outputs"][:20].contiguous())),
     "but 'expert_weights' \\[6, 4\\] says \\[capacity \\* top_k, hidden\\] = \\[24, hidden\\]"),
    (dict(tensors=lambda t: t.update(hidden=torch.zeros(6, 256, dtype=BF16), output=torch.zeros(6, 256, dtype=BF16))),
     "tensor 'output' is the finalize result"),
    (dict(tensors=lambda t: t.pop("residual")), "tensor 'next_norm_weight' needs tensor 'residual'"),
    (dict(header_edit=_set("expert_outputs", "dtype", "Q7")), "unknown dtype \"Q7\""),
    (dict(header_edit=_set("residual", "shape", [6, 128])),
     "data_offsets span|tensor 'residual' has shape"),
    (dict(header_edit=_set("expert_outputs", "data_offsets", [0, 10 ** 9])), "truncated: tensor 'expert_outputs'"),
    (dict(header_edit=_set("expert_outputs", "data_offsets", [10, 2])), "0 <= begin <= end"),
    (dict(header_edit=_set("expert_outputs", "shape", [6, 4, -256])), "not a non-negative integer"),
    (dict(header_edit=_set("expert_outputs", "shape", [6, 4, 256.0])), "not a non-negative integer"),
    (dict(header_edit=_set("post_norm_weight", "shape", [128, 2])), "tensor 'post_norm_weight' has shape"),
    (dict(header_edit=_set("expert_weights", "data_offsets", None)), "no \"data_offsets\""),
    (dict(meta={"routed_scale": "fast"}), "metadata routed_scale=\"fast\" is not a number"),
    (dict(meta={"scales": "0.5"}), "is not two numbers"),
    (dict(meta={"live_tokens": "99"}), "must be an integer in \\[0, capacity = 6\\]"),
    (dict(meta={"post_eps": "1"}), None),  # a valid file: positive eps
    (dict(meta={"post_eps": "-1"}), "the library rejects these tensors"),
    (dict(meta={"routed_scale": 2}), "__metadata__ value of 'routed_scale' must be a string"),
])
def test_malformed(gen, tmp_path, change, words):
    t, meta = fused_case(gen, with_results=False)
    meta.update(change.get("meta", {}))
    if "tensors" in change:
        change["tensors"](t)
    path = save_file(tmp_path / "bad.safetensors", t, meta, header_edit=change.get("header_edit"))
    if words is None:
        assert beammoe.audit_file(str(path), "cpu").ok
        return
    with pytest.raises(ValueError, match=words):
        beammoe.audit_file(str(path), "cpu")


def test_library_rejects_shape(gen, tmp_path):
    g = random_bf16(gen, 2, 2, 300)
    w = torch.ones(2, 2)
    path = save_file(tmp_path / "h.safetensors", {"expert_outputs": g, "expert_weights": w})
    with pytest.raises(ValueError, match=r"the library rejects this shape: .*hidden=300"):
        beammoe.audit_file(str(path))


def test_truncated_and_bad_json(gen, tmp_path):
    t, meta = fused_case(gen, with_results=False)
    good = save_file(tmp_path / "g.safetensors", t, meta).read_bytes()
    cases = [
        (good[:5], "truncated: 5 bytes"),
        (good[:-7], "truncated: tensor"),
        (struct.pack("<Q", 10 ** 6) + good[8:200], "header length 1000000 is past the end"),
        (struct.pack("<Q", 7) + b"{\"a\": 1", "bad header JSON"),
        (struct.pack("<Q", 8) + b"[1, 2]  ", "the top level must be an object"),
        (struct.pack("<Q", 8) + b"{}  xx  ", "bytes after the top-level object"),
        (struct.pack("<Q", 8) + b"{}\0     ", "NUL byte"),
        (struct.pack("<Q", 16) + b"{\"a\": NaN}      ", "bad header JSON"),
    ]
    for i, (raw, words) in enumerate(cases):
        p = tmp_path / ("t%d.safetensors" % i)
        p.write_bytes(raw)
        with pytest.raises(ValueError, match=words):
            beammoe.audit_file(str(p), "cpu")
    # size mismatch: one element more claimed than stored
    path = save_file(tmp_path / "s.safetensors", t, meta,
                     header_edit=_set("expert_weights", "shape", [6, 5]), tail=b"\0" * 64)
    with pytest.raises(ValueError, match=r"data_offsets span 96 bytes, but F32 x 30 elements need 120"):
        beammoe.audit_file(str(path), "cpu")
    with pytest.raises(ValueError, match="not a regular file"):
        beammoe.audit_file(str(tmp_path), "cpu")


def test_flipped_stored_bit(gen, tmp_path):
    t, meta = fused_case(gen)
    path = save_file(tmp_path / "f.safetensors", t, meta)
    flip_bit(path, "normalized", index=11)
    rep = beammoe.audit_file(str(path), "cpu")
    assert not rep.ok
    bad = [r for r in rep.rows if not r.ok]
    assert len(bad) == 1 and bad[0].strategy == "stored:normalized" and bad[0].mismatches == 1
    assert "<-- MISMATCH" in str(rep) and "FAIL" in str(rep)


def test_bad_backend_argument(gen, tmp_path):
    t, meta = finalize_case(gen)
    with pytest.raises(ValueError, match="unknown backend"):
        beammoe.audit_file(str(save_file(tmp_path / "f.safetensors", t, meta)), "tpu")


def test_special_files_refused_at_once(tmp_path):
    """A FIFO with no writer (a reader that opens it first waits for ever), a
    link to it, a directory, a device: ValueError at once naming what it is,
    with the words of the C tool, which exits 2 on each, also at once."""
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(str(fifo))
    link = tmp_path / "link.safetensors"
    link.symlink_to(fifo.name)
    cases = [(fifo, "a FIFO"), (link, "a FIFO"), (tmp_path, "a directory")]
    if os.path.exists("/dev/null"):
        cases.append(("/dev/null", "a character device"))
    for path, kind in cases:
        got = {}

        def body():
            try:
                beammoe.audit_file(str(path), "cpu")
            except BaseException as e:  # reported below
                got["e"] = e
        th = threading.Thread(target=body, daemon=True)
        th.start()
        th.join(10)
        if th.is_alive():
            # let the blocked reader go (a writer that leaves), then fail
            os.close(os.open(str(fifo), os.O_WRONLY | os.O_NONBLOCK))
            th.join(10)
            pytest.fail("audit_file(%s) still blocked after 10 s" % path)
        assert isinstance(got.get("e"), ValueError), got
        assert "not a regular file (%s)" % kind in str(got["e"]), str(got["e"])
    tool = tool_path()
    if tool is None:
        return
    for path, kind in cases:
        try:
            r = subprocess.run([tool, "audit", "--input", str(path)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, universal_newlines=True, timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("beammoe audit --input %s still running after 10 s" % path)
        if "without json-c" in r.stdout:
            return
        assert r.returncode == 2 and "not a regular file (%s)" % kind in r.stdout, r.stdout


# ---- the reader's strictness: the rules of tools/safetensors.c (its test
# script tools/safetensors-test.sh has the same files), with its words ----

_audit = importlib.import_module("beammoe.audit")


def _strict_base(gen):
    """Header entries (name, JSON text) and data of a small finalize problem
    whose data_offsets tile the data section in the order given."""
    g, w = random_case(gen, 2, 2, 256)
    def raw(t):  # little-endian host, no NumPy (PyPI's torch does not bring it)
        t = t.contiguous()
        return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())
    tensors = [("expert_outputs", "BF16", [2, 2, 256], raw(g)),
               ("expert_weights", "F32", [2, 2], raw(w))]
    parts, data = [], b""
    for name, dt, shape, raw in tensors:
        parts.append((name, '{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}'
                      % (dt, json.dumps(shape), len(data), len(data) + len(raw))))
        data += raw
    return parts, data


def _obj(parts):
    return "{" + ",".join('"%s":%s' % (n, e) for n, e in parts) + "}"


def _file(header, data=b"", hlen=None):
    """A file of `header` (text or bytes, padded to 8 bytes) and data."""
    js = header if isinstance(header, bytes) else header.encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js) if hlen is None else hlen) + js + data


def _with(parts, name, field):
    """parts with `field` (JSON text) added first in the entry `name`."""
    return [(n, e.replace("{", "{" + field + ",", 1) if n == name else e) for n, e in parts]


def _strict_cases(parts, data):
    """(file name, bytes, words of the error or None for a good file, what
    the C tool says: True the same message word for word, "json" a JSON
    syntax error in json-c's words, None not compared: JSON that json-c's
    strict mode still takes (NaN, Infinity, 00, 1.) but RFC 8259 and the
    format's reference reader do not)."""
    ex_len = int(json.loads(parts[0][1])["data_offsets"][1])
    w_len = len(data) - ex_len
    text = _obj(parts)
    nested = lambda k: "[" * k + "]" * k
    ex, wt = parts

    def offs(name, b, e):
        return [(n, json.dumps(dict(json.loads(t), data_offsets=[b, e])) if n == name else t)
                for n, t in parts]
    return [
        # good: the header's order is free, padding around it, what json-c reads
        ("good-order", _file(_obj(parts[::-1]), data), None, True),
        ("good-padding", _file(" \n\t" + text + "\r\n", data), None, True),
        ("good-empty-tensor-at-end", _file(_obj(parts + [("e", '{"dtype":"U8","shape":[0],"data_offsets":'
                                                           '[%d,%d]}' % (len(data), len(data)))]), data),
         None, True),
        ("good-extra-fields", _file(_obj(_with(parts, "expert_weights",
                                               '"x":[1e999,%s,-0,"\\/","\\ud83d\\ude00","a\tb\x01"]'
                                               % ("9" * 5000))), data), None, True),
        ("good-nesting-32", _file(_obj(_with(parts, "expert_weights", '"x":' + nested(30))), data),
         None, True),
        # the header itself
        ("bad-null", _file("null"), "the top level must be an object, not null", True),
        ("bad-toplevel-string", _file('"abc"'), "the top level must be an object, not string", True),
        ("bad-nesting-33", _file(_obj(_with(parts, "expert_weights", '"x":' + nested(31))), data),
         "bad header JSON: nesting too deep", True),
        ("bad-nesting-2000", _file(_obj(_with(parts, "expert_weights", '"x":' + nested(2000))), data),
         "bad header JSON: nesting too deep", True),
        ("bad-syntax", _file(_obj(_with(parts, "expert_weights", '"x":[1,]')), data), "bad header JSON",
         "json"),
        ("bad-nan", _file(_obj(_with(parts, "expert_weights", '"x":NaN')), data),
         "bad header JSON: NaN is not JSON", None),
        ("bad-infinity", _file(_obj(_with(parts, "expert_weights", '"x":-Infinity')), data),
         "bad header JSON: -Infinity is not JSON", None),
        ("bad-leading-zero", _file(_obj(_with(parts, "expert_weights", '"x":00')), data), "bad header JSON",
         None),
        ("bad-bare-point", _file(_obj(_with(parts, "expert_weights", '"x":1.')), data), "bad header JSON",
         None),
        ("bad-raw-nul", _file(text.encode().replace(b"expert_w", b"expert\0w"), data),
         "bad header: NUL byte inside the JSON", True),
        ("bad-utf8", _file(text.encode().replace(b"expert_w", b"expert\xffw"), data),
         r"bad header: not valid UTF-8 \(byte %d of the JSON\)" % (text.index("expert_w") + 6), True),
        ("bad-overlong", _file(text.encode().replace(b"_w", b"\xc0\xafw"), data), "not valid UTF-8", True),
        ("bad-utf8-surrogate", _file(text.encode().replace(b"_w", b"\xed\xa0\x80w"), data),
         "not valid UTF-8", True),
        ("bad-utf8-cut", _file(text.encode() + b" \xe2\x82", data), "not valid UTF-8", True),
        # strings: a NUL would cut a C name; a lone surrogate is not Unicode
        ("bad-nul-name", _file(text.replace('"expert_weights"', '"expert_weights\\u0000.x"'), data),
         r"bad header: \\u0000 \(NUL\) inside a string of the JSON", True),
        ("bad-nul-value", _file(_obj(_with(parts, "expert_weights", '"x":["a\\u0000"]')), data),
         r"\(NUL\) inside a string", True),
        ("bad-surrogate", _file(text.replace("expert_w", "expert\\ud800w"), data),
         "bad header: a string of the JSON has an unpaired UTF-16 surrogate escape", True),
        ("bad-low-surrogate", _file(text.replace("expert_w", "expert\\uDC00w"), data),
         "unpaired UTF-16 surrogate", True),
        ("bad-surrogate-then-escape", _file(text.replace("expert_w", "expert\\ud800\\u0041w"), data),
         "unpaired UTF-16 surrogate", True),
        ("bad-surrogate-meta", _file(_obj([("__metadata__", '{"k":"\\udbff"}')] + parts), data),
         "unpaired UTF-16 surrogate", True),
        # a key given twice, at any depth
        ("bad-dup-name", _file(_obj(parts + [wt]), data),
         "bad header JSON: the name 'expert_weights' appears twice", True),
        ("bad-dup-escaped", _file(_obj(parts + [("expert\\u005fweights", wt[1])]), data),
         "the name 'expert_weights' appears twice", True),
        ("bad-dup-field", _file(_obj(_with(parts, "expert_weights", '"dtype":"F32"')), data),
         "bad header JSON: a key appears twice inside the entry 'expert_weights'", True),
        ("bad-dup-meta", _file(_obj([("__metadata__", '{"live_tokens":"1","live_tokens":"2"}')] + parts),
                               data),
         "a key appears twice inside the entry '__metadata__'", True),
        ("bad-dup-deep", _file(_obj(_with(parts, "expert_outputs", '"x":[{"y":{"a":1,"a":1}}]')), data),
         "a key appears twice inside the entry 'expert_outputs'", True),
        # data_offsets must tile the data section
        ("bad-overlap", _file(_obj(offs("expert_weights", 16, 16 + w_len)), data),
         r"bad data_offsets: tensor 'expert_weights' \[16, %d\] overlaps tensor 'expert_outputs', "
         r"which ends at %d" % (16 + w_len, ex_len), True),
        ("bad-empty-inside", _file(_obj(parts + [("e", '{"dtype":"U8","shape":[0],"data_offsets":[8,8]}')]),
                                   data), "tensor 'e' \\[8, 8\\] overlaps tensor 'expert_outputs'", True),
        ("bad-gap", _file(_obj(offs("expert_weights", ex_len + 8, ex_len + 8 + w_len)), data + b"\0" * 8),
         r"bad data_offsets: bytes \[%d, %d\) of the data belong to no tensor \(tensor 'expert_weights' "
         r"begins at %d\)" % (ex_len, ex_len + 8, ex_len + 8), True),
        ("bad-gap-first", _file(_obj(parts[1:]), data), r"bytes \[0, %d\) of the data belong to no tensor"
         % ex_len, True),
        ("bad-tail", _file(text, data + b"\0" * 8),
         "bad data_offsets: the tensors cover %d bytes, but the data section after the header has %d"
         % (len(data), len(data) + 8), True),
        # the header length against the file's size
        ("bad-hlen", _file("{}", hlen=1 << 40), "truncated: header length 1099511627776 is past the end "
         "of the file", True),
        ("bad-hlen-max", _file("{}", hlen=(1 << 64) - 1), "header length 18446744073709551615 is past the end",
         True),
        ("bad-hlen-one", _file(text, data, hlen=1), r"header length 1 is not in \[2, 100000000\]", True),
    ]


def test_strict_reader(gen, tmp_path):
    """Each malformed file is refused with the C reader's words (and the C
    tool, when built, refuses it with the same message); each good one
    audits clean in both."""
    parts, data = _strict_base(gen)
    tool = tool_path()
    for name, raw, words, same in _strict_cases(parts, data):
        path = tmp_path / (name + ".safetensors")
        path.write_bytes(raw)
        err = None
        if words is None:
            rep = beammoe.audit_file(str(path), "cpu")
            assert rep.ok, (name, str(rep))
        else:
            try:
                beammoe.audit_file(str(path), "cpu")
                pytest.fail("%s: no ValueError" % name)
            except ValueError as e:
                err = str(e)
            assert re.search(words, err), (name, words, err)
        if tool is None or (words is not None and same is None):
            continue
        rc, out = c_audit(tool, path)
        if words is None:
            assert rc == 0, (name, out)
        elif same is True:
            assert rc == 2 and ("beammoe audit: %s\n" % err) in out, (name, err, out)
        else:
            assert rc == 2 and ("beammoe audit: %s: bad header JSON" % path) in out, (name, out)


def _sparse(path, size, head):
    """`head` then zeros up to `size` bytes, without writing them; False when
    the file system cannot leave them out."""
    with open(str(path), "wb") as f:
        f.write(head)
        f.truncate(size)
    return os.stat(str(path)).st_blocks * 512 < (1 << 20)


@pytest.fixture
def reads(monkeypatch):
    """Every read of the safetensors reader: the list of their sizes."""
    sizes = []
    real = _audit._read_exact

    def counted(f, n):
        sizes.append(n)
        return real(f, n)
    monkeypatch.setattr(_audit, "_read_exact", counted)
    return sizes


def test_header_before_data(gen, tmp_path, reads):
    """A bad header in front of 4 GiB (a sparse file) is refused after
    reading the length and the header, never the data; a good file's data
    is read once, after them."""
    parts, data = _strict_base(gen)
    good = tmp_path / "good.safetensors"
    good.write_bytes(_file(_obj(parts), data))
    hlen = struct.unpack("<Q", good.read_bytes()[:8])[0]
    assert beammoe.audit_file(str(good), "cpu").ok
    assert reads == [8, hlen, len(data)]

    big = 1 << 32
    header = _file(_obj(parts))  # data_offsets cover len(data) bytes of 4 GiB
    cases = [(_file('{"a":[1 '), "bad header JSON"),
             (_file(_obj(parts + parts[1:])), "the name 'expert_weights' appears twice"),
             (header, "the tensors cover %d bytes, but the data section after the header has %d"
              % (len(data), big - len(header)))]
    tool = tool_path()
    for i, (head, words) in enumerate(cases):
        path = tmp_path / ("big%d.safetensors" % i)
        if not _sparse(path, big, head):
            pytest.skip("no sparse files here")
        del reads[:]
        t0 = time.time()
        with pytest.raises(ValueError, match=words):
            beammoe.audit_file(str(path), "cpu")
        assert time.time() - t0 < 10
        assert reads == [8, len(head) - 8], reads
        if tool is not None:
            rc, out = c_audit(tool, path)
            assert rc == 2 and re.search(words, out), out
        os.unlink(str(path))


def test_header_length_past_the_file(tmp_path, reads):
    """The length is checked against the file's size before the header is
    read: nothing but the 8 bytes."""
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}" + b" " * 100)
    with pytest.raises(ValueError, match=r"truncated: header length 1000 is past the end of the file "
                                         r"\(110 bytes\)"):
        beammoe.audit_file(str(path), "cpu")
    assert reads == [8]
