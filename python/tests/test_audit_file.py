"""beammoe.audit_file and `python3 -m beammoe audit`: the audit of a
safetensors file (docs/safetensors.md), against files written by a tiny
writer here and by the C tool's `beammoe run --output`, and agreeing with
the C tool's `beammoe audit --input` on pass/fail."""
import ctypes
import json
import os
import struct
import subprocess
import sys

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
    (dict(header_edit=_drop("expert_outputs")), "missing tensor 'expert_outputs'"),
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
