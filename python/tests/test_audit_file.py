"""beammoe.audit_file and `python3 -m beammoe audit`: both run the C tool's
`beammoe audit --input FILE` (docs/safetensors.md) on files written here.
Skipped where the tool is not found (a package installed without it)."""
import ctypes
import json
import os
import re
import struct
import subprocess
import sys

import pytest
import torch

import beammoe
from beammoe import audit
from reference import BF16, layer, random_case

_pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(beammoe.__file__)))  # the package under test


def _tool():
    """(path, environment) of the tool audit_file finds, else of tools/beammoe of
    the build tree the library comes from (make check: a VPATH build; then
    BEAMMOE_TOOL names it); None when there is none."""
    try:
        return audit.find_tool()
    except RuntimeError:
        top = os.path.dirname(os.path.dirname(os.path.realpath(beammoe.library_path())))
        p = os.path.join(top, "tools", "beammoe")
        return (p, {"BEAMMOE_TOOL": p}) if os.access(p, os.X_OK) else None


@pytest.fixture
def tool(monkeypatch, tmp_path):
    found = _tool()
    if found is None:
        pytest.skip("the beammoe tool is not found (build the tree, or set BEAMMOE_TOOL)")
    r = subprocess.run([found[0], "audit", "--input", str(tmp_path / "none")], env=dict(os.environ, **found[1]),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if "json-c" in r.stderr:
        pytest.skip("the beammoe tool was built without json-c")
    if "BEAMMOE_TOOL" in found[1]:
        monkeypatch.setenv("BEAMMOE_TOOL", found[0])
    return found[0]


def save_file(path, tensors, metadata=None):
    """The safetensors writer of docs/safetensors.md (struct + json)."""
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
    js = json.dumps(header).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + b"".join(blobs))
    return path


def fused_file(gen, path):
    """A fused problem with an unused tensor; hidden and normalized from the library."""
    g, w, residual, pw, nw = layer(gen, 6, 4, 256)
    h, n = beammoe.beam_moe_finalize_norm_residual_norm(
        beammoe.MoEOutput(g, w, 6), residual.clone(), pw, 1e-6, nw, 1e-5, (0.5, 2.0), 1.5)
    t = {"expert_outputs": g, "expert_weights": w, "residual": residual, "post_norm_weight": pw,
         "next_norm_weight": nw, "hidden": h, "normalized": n, "extra": torch.randn(2, generator=gen)}
    meta = {"routed_scale": "1.5", "post_eps": "1e-6", "next_eps": "1e-5", "scales": "0.5,2"}
    return save_file(path, t, meta)


def finalize_file(gen, path, flip=False):
    """A finalize problem and its output; flip: one bit of it flipped."""
    tokens, top_k, hidden = 5, 2, 512
    g, w = random_case(gen, tokens + 2, top_k, hidden)  # capacity > live tokens
    out = torch.empty(tokens, hidden, dtype=BF16)
    beammoe.beam_moe_finalize(g, w, out, 0.75)
    if flip:
        out.view(torch.int16)[2, 7] ^= 1
    return save_file(path, {"expert_outputs": g.view(tokens + 2, top_k, hidden), "expert_weights": w,
                            "output": out}, {"routed_scale": "0.75", "live_tokens": str(tokens)})


def test_pass_and_notes(gen, tmp_path, tool):
    rep = beammoe.audit_file(fused_file(gen, tmp_path / "f.safetensors"), backends="cpu")
    assert rep.ok and rep.status == 0, str(rep) + rep.stderr
    assert "stored:normalized" in str(rep) and "PASS" in str(rep)
    assert rep.notes == ["tensor 'extra' is not used"]
    assert beammoe.audit_file(finalize_file(gen, tmp_path / "g.safetensors"), ["cpu"]).ok


def test_flipped_output_bit(gen, tmp_path, tool):
    rep = beammoe.audit_file(finalize_file(gen, tmp_path / "x.safetensors", flip=True), "all")
    assert not rep.ok and rep.status == 1
    assert re.search(r"file +stored:output +2560 +1 +1  <-- MISMATCH", str(rep)), str(rep)
    assert "1 mismatching in 1 rows" in str(rep) and "FAIL" in str(rep)


def test_bad_file(gen, tmp_path, tool):
    _, w = random_case(gen, 3, 2, 256)
    bad = save_file(tmp_path / "bad.safetensors", {"expert_weights": w})
    with pytest.raises(ValueError, match=r"bad\.safetensors: missing tensor 'expert_outputs'"):
        beammoe.audit_file(bad)


def test_backend_asked_for(gen, tmp_path, tool):
    path = finalize_file(gen, tmp_path / "c.safetensors")
    rep = beammoe.audit_file(path, "cuda")
    if "backends: cpu, cuda" in str(rep):
        assert rep.ok
    else:  # asked for by name, the backend that cannot run here fails the audit
        assert not rep.ok and rep.status == 0 and "backend cuda was asked for" in rep.notes[-1]


def test_unknown_backend_and_missing_tool(tmp_path, monkeypatch):
    monkeypatch.setenv("BEAMMOE_TOOL", str(tmp_path / "no-such-tool"))
    with pytest.raises(ValueError, match=r"unknown backend 'tpu'"):  # before the tool is looked for
        beammoe.audit_file(tmp_path / "f.safetensors", ["cpu", "tpu"])
    with pytest.raises(RuntimeError, match=r"cannot run BEAMMOE_TOOL=.*no-such-tool"):
        beammoe.audit_file(tmp_path / "f.safetensors")


def test_cli_exit_status(gen, tmp_path, tool):
    env = dict(os.environ, PYTHONPATH=_pkg_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("BEAMMOE_LIBRARY", beammoe.library_path())

    def cli(path):
        r = subprocess.run([sys.executable, "-m", "beammoe", "audit", str(path), "--backend", "cpu"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        return r.returncode, r.stdout

    rc, out = cli(finalize_file(gen, tmp_path / "ok.safetensors"))
    assert rc == 0 and "PASS" in out, out
    rc, out = cli(finalize_file(gen, tmp_path / "x.safetensors", flip=True))
    assert rc == 1 and "MISMATCH" in out, out
    rc, out = cli(tmp_path / "absent.safetensors")
    assert rc == 2 and "beammoe audit: " in out and "absent.safetensors: cannot open" in out, out
