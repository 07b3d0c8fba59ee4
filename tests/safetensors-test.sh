#!/bin/sh
# safetensors-test.sh - `beammoe audit --input` and `beammoe run --output`.
#
# Good files (written here with python3's struct/json only, and by `run
# --output`) must audit clean (exit 0); a stored result with one flipped bit
# must be a mismatch (exit 1); every malformed file must be exit 2 with the
# expected words in the message, never a crash. The reader is strict where
# two readers could disagree (duplicate keys, data_offsets that overlap or
# leave gaps, names that are not valid UTF-8 or hold a NUL, a `null` header)
# and reads the header before the data. Exit 77 (skip) when the tool was
# built without json-c. Without python3 only the `run --output` part runs.
. "$(dirname "$0")/tool-lib.sh"
need_json_c audit --input "$tmp/none.safetensors"

# ---- run --output, then audit --input: the round trip ----
run_out() {
    name=$1
    shift
    "$tool" run --iters 1 "$@" --output "$tmp/$name" >"$tmp/out" 2>"$tmp/err"
    check "run $* --output"
    sed -n 's/^checksum: *//p' "$tmp/out" >"$tmp/$name.sum"
}
run_out rt-fused.safetensors --tokens 9 --top-k 8 --hidden 512 --post-norm --next-norm \
    --scales 0.5,2 --routed-scale 2.5 --eps 1e-5
run_out rt-plain.safetensors --tokens 5 --top-k 2 --hidden 256
run_out rt-final.safetensors --op finalize --tokens 7 --top-k 4 --hidden 256 --post-norm \
    --routed-scale 0.75
run_out rt-empty.safetensors --tokens 0 --top-k 1 --hidden 256 --next-norm
expect_input 0 "$tmp/rt-fused.safetensors"
expect_input 0 "$tmp/rt-plain.safetensors"
expect_input 0 "$tmp/rt-final.safetensors"
expect_input 0 "$tmp/rt-empty.safetensors"
# ---- run --input: the case a file holds, run again: the same checksum as
# the run that wrote it, on every op the file can hold ----
for f in rt-fused rt-plain rt-final rt-empty; do
    "$tool" run --iters 2 --input "$tmp/$f.safetensors" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    got=$(sed -n 's/^checksum: *//p' "$tmp/out")
    want=$(cat "$tmp/$f.safetensors.sum")
    [ "$rc" = 0 ] && [ -n "$got" ] && [ "$got" = "$want" ] && grep -q "^input: *$tmp/$f.safetensors$" "$tmp/out"
    check "run --input $f.safetensors: exit $rc, checksum '$got', as written ($want)"
done
# --strategy needs the fused op: a finalize file says which op it holds
"$tool" run --iters 1 --strategy unfused --input "$tmp/rt-final.safetensors" >/dev/null 2>"$tmp/err"
[ $? = 2 ] && grep -q "holds a finalize case" "$tmp/err"
check "run --input (finalize) --strategy: exit 2, the file holds a finalize case"
# the whole file name in the report, however long (it was cut to what the
# case column left over: 12 characters for a fused case with every option)
long="$tmp/a-file-name-of-more-than-twelve-characters-rt-fused.safetensors"
cp "$tmp/rt-fused.safetensors" "$long"
"$tool" audit --quick --input "$long" >"$tmp/out" 2>"$tmp/err" && grep -qF "input $long," "$tmp/out"
check "audit --input: the whole file name is shown"
rm -f "$long"
# --output with an op it cannot hold is a usage error
"$tool" run --op nrn --tokens 1 --hidden 256 --output "$tmp/nrn.st" >/dev/null 2>"$tmp/err"
[ $? = 2 ] && grep -q "finalize and fused only" "$tmp/err"
check "run --op nrn --output: a usage error"

if command -v python3 >/dev/null 2>&1; then
    python3 - "$tmp" <<'EOF' || { echo "FAIL: python3 could not write the test files"; exit 99; }
import json, os, random, struct, sys
d = sys.argv[1]
rnd = random.Random(5)

def bf16(v):  # nearest-even, as docs/numerics.md#bf16
    u = struct.unpack('<I', struct.pack('<f', v))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF

def bf16_bytes(vals):
    return b''.join(struct.pack('<H', bf16(v) if isinstance(v, float) else v) for v in vals)

def f32_bytes(vals):
    return b''.join(struct.pack('<f', v) for v in vals)

# want: the words of the message that refuses the file ('': it audits clean),
# into the list that the shell reads ("expected": exit status, name, words)
expected = []

def save(name, blob, want):
    open(os.path.join(d, name + '.safetensors'), 'wb').write(blob)
    if want is not None:
        expected.append('%d %s %s\n' % (2 if want else 0, name, want))

def write(name, tensors, meta=None, header=None, data_cut=0, raw=None, want=None):
    """tensors: list of (name, dtype, shape, bytes); header: edit the dict."""
    if raw is not None:
        save(name, raw, want)
        return
    h, data = {}, b''
    if meta is not None:
        h['__metadata__'] = meta
    for n, dt, shape, b in tensors:
        h[n] = {'dtype': dt, 'shape': list(shape), 'data_offsets': [len(data), len(data) + len(b)]}
        data += b
    if header:
        header(h)
    js = json.dumps(h, separators=(',', ':')).encode()
    js += b' ' * (-len(js) % 8)
    blob = struct.pack('<Q', len(js)) + js + data
    save(name, blob[:len(blob) - data_cut], want)

C, K, H, T = 6, 4, 256, 5
NAN = 0x7FC1
def rows(n, width, live):  # rows past `live` are NaN: they must never be read
    return [rnd.uniform(-2, 2) if r < live else NAN for r in range(n) for _ in range(width)]
ex = bf16_bytes(rows(C * K, H, T * K))
w = f32_bytes([rnd.uniform(-1, 1) if i < T * K else float('nan') for i in range(C * K)])
res = bf16_bytes(rows(T, H, T))
nw = bf16_bytes([rnd.uniform(0.5, 1.5) for _ in range(H)])
base = [('expert_outputs', 'BF16', [C, K, H], ex), ('expert_weights', 'F32', [C, K], w)]
fused = base + [('residual', 'BF16', [T, H], res), ('next_norm_weight', 'BF16', [H], nw)]
meta = {'routed_scale': '1.5', 'post_eps': '1e-5', 'next_eps': '1e-6', 'live_tokens': str(T),
        'scales': '0.5,2'}

# good files
write('good-fused', fused, meta, want='')
write('good-flat',  # [capacity*top_k, hidden], post norm without a weight
      [('expert_outputs', 'BF16', [C * K, H], ex)] + fused[1:], meta, want='')
write('good-finalize', base, want='')  # no metadata: finalize of every row
write('good-finalize-live', base, {'live_tokens': str(T), 'post_eps': '1e-6'}, want='')
write('good-extra', fused + [('something_else', 'I32', [2], b'\0' * 8)], meta, want='')

# malformed files: name, then the words the message must contain
write('bad-short', None, raw=b'\x10\0\0', want='truncated')
write('bad-hlen', None, raw=struct.pack('<Q', 1 << 40) + b'{}', want='past the end of the file')
write('bad-hlen-max', None, raw=struct.pack('<Q', (1 << 64) - 1) + b'{}', want='past the end of the file')
write('bad-data-cut', fused, meta, data_cut=100, want='past the end of the data')
write('bad-json', None, raw=struct.pack('<Q', 8) + b'{"a": [1', want='bad header JSON')
write('bad-json-tail', None, raw=struct.pack('<Q', 8) + b'{} xx   ', want='bad header JSON')
write('bad-json-nul', None, raw=struct.pack('<Q', 8) + b'{}\0     ', want='NUL')
write('bad-toplevel', None, raw=struct.pack('<Q', 8) + b'[1,2]   ', want='must be an object')
write('bad-no-experts', base[1:], meta, want="missing tensor 'expert_outputs'")
write('bad-no-weights', base[:1], want="missing tensor 'expert_weights'")
write('bad-dtype', [('expert_outputs', 'F16', [C, K, H], ex)] + base[1:], want='has dtype F16, expected BF16')
write('bad-wdtype', [base[0], ('expert_weights', 'BF16', [C, K * 2], w)], want='has dtype BF16, expected F32')
write('bad-unknown-dtype', [('expert_outputs', 'Q4', [C, K, H], ex)] + base[1:], want='unknown dtype')
write('bad-shape', [base[0], ('expert_weights', 'F32', [C * K // 2, 2], w)], want="tensor 'expert_outputs' has shape")
write('bad-flat', [('expert_outputs', 'BF16', [C * K * H // 512, 512], ex)] + base[1:], want=r'capacity \* top_k')
write('bad-rank', [('expert_outputs', 'BF16', [C * K * H], ex)] + base[1:], want=r'has shape \[6144\]')
write('bad-size', [('expert_outputs', 'BF16', [C, K, H // 2], ex)] + base[1:], want='data_offsets span')
def neg(h): h['expert_outputs']['shape'][0] = -1
write('bad-negative', base, header=neg, want='not a non-negative integer')
def huge(h): h['expert_outputs']['shape'] = [1 << 40, 1 << 40, 1 << 40]
write('bad-huge', base, header=huge, want='shape too large')
def fshape(h): h['expert_weights']['shape'] = [C, 4.0]
write('bad-float-shape', base, header=fshape, want='not a non-negative integer')
def offs(h): h['expert_weights']['data_offsets'] = [10, 5]
write('bad-offsets', base, header=offs, want='begin <= end')
def nooffs(h): del h['expert_weights']['data_offsets']
write('bad-no-offsets', base, header=nooffs, want='data_offsets')
write('bad-hidden',  # the library's own rule
      [('expert_outputs', 'BF16', [2, 1, 300], bf16_bytes([1.0] * 600)),
       ('expert_weights', 'F32', [2, 1], f32_bytes([1.0, 1.0]))], want='hidden=300')
write('bad-topk',
      [('expert_outputs', 'BF16', [1, 33, 256], bf16_bytes([1.0] * (33 * 256))),
       ('expert_weights', 'F32', [1, 33], f32_bytes([1.0] * 33))], want='top_k=33')
write('bad-meta-type', base, {'routed_scale': 2}, want='must be a string')
write('bad-meta-number', base, {'routed_scale': 'two'}, want='is not a number')
write('bad-live', base, {'live_tokens': str(C + 1)}, want='live_tokens')
write('bad-scales', fused, {'scales': '0.5'}, want='two numbers')
write('bad-eps', fused, {'next_eps': '-1'}, want='the library rejects')  # the library's own rule
write('bad-next-no-res', base + fused[3:], meta, want="needs tensor 'residual'")
write('bad-res-rows', base + [('residual', 'BF16', [T - 1, H], res[:(T - 1) * H * 2])],
      meta, want='fewer than live_tokens')
write('bad-res-hidden', base + [('residual', 'BF16', [T, H // 2], res[:T * H])], meta,
      want="tensor 'residual' has shape")
write('bad-normw', fused + [('post_norm_weight', 'BF16', [H + 1], nw + b'\0\0')], meta, want=r'expected \[hidden\]')
write('bad-stored', fused + [('hidden', 'BF16', [T + 1, H], res + nw)], meta,
      want=r'expected \[live_tokens, hidden\]')

# strictness: what two readers could read two ways is refused
def raw_header(name, js, data, want=None):
    js = js if isinstance(js, bytes) else js.encode()
    js += b' ' * (-len(js) % 8)
    save(name, struct.pack('<Q', len(js)) + js + data, want)
def entries(tensors):
    """header entries (text) and data of tensors, offsets as written"""
    parts, data = [], b''
    for n, dt, shape, b in tensors:
        parts.append((n, '{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}'
                      % (dt, json.dumps(list(shape)), len(data), len(data) + len(b))))
        data += b
    return parts, data
parts, blob = entries(base)
def obj(ps):
    return '{' + ','.join('"%s":%s' % (n, e) for n, e in ps) + '}'
write('bad-null', None, raw=struct.pack('<Q', 8) + b'null    ', want='top level must be an object, not null')
raw_header('bad-dup-name', obj(parts + [parts[1]]), blob, want="the name 'expert_weights' appears twice")
raw_header('bad-dup-escaped', obj(parts + [('expert\\u005fweights', parts[1][1])]), blob,
           want="the name 'expert_weights' appears twice")
raw_header('bad-dup-field',
           obj([parts[0], (parts[1][0], parts[1][1].replace('{', '{"dtype":"F32",', 1))]), blob,
           want="appears twice inside the entry 'expert_weights'")
raw_header('bad-dup-meta',
           obj([('__metadata__', '{"live_tokens":"1","live_tokens":"2"}')] + parts), blob,
           want="appears twice inside the entry '__metadata__'")
raw_header('good-order', obj(parts[::-1]), blob, want='')  # JSON order is free
def offsets(h, name, b, e): h[name]['data_offsets'] = [b, e]
write('bad-overlap', base,  # expert_weights inside expert_outputs
      header=lambda h: offsets(h, 'expert_weights', 16, 16 + len(base[1][3])),
      want="overlaps tensor 'expert_outputs'")
write('bad-gap', [base[0], ('pad', 'U8', [8], b'\0' * 8), base[1]],
      header=lambda h: h.pop('pad'), want='belong to no tensor')
write('bad-tail', base + [('pad', 'U8', [8], b'\0' * 8)],
      header=lambda h: h.pop('pad'), want='the tensors cover')
raw_header('bad-utf8', obj(parts).encode().replace(b'expert_w', b'expert\xffw'), blob, want='not valid UTF-8')
raw_header('bad-overlong', obj(parts).encode().replace(b'_w', b'\xc0\xafw'), blob, want='not valid UTF-8')
# json-c would cut this name at the NUL and find 'expert_weights'
raw_header('bad-nul-name',
           obj(parts).replace('"expert_weights"', '"expert_weights\\u0000.x"'), blob, want='(NUL) inside a string')
raw_header('bad-surrogate', obj(parts).replace('expert_w', 'expert\\ud800w'), blob,
           want='unpaired UTF-16 surrogate')

# strict JSON, as the format's reference reader (serde_json) reads it:
# RFC 8259 numbers, no raw control character in a string.
# json-c took each of these (in a field the reader did not look at, or in a
# name or a metadata value) and the tool audited the file.
def with_field(value):
    return obj([parts[0], (parts[1][0], parts[1][1].replace('{', '{"x":%s,' % value, 1))])
for name, value in [('nan', 'NaN'), ('inf', 'Infinity'), ('minus-inf', '-Infinity'), ('00', '00'),
                    ('minus-00', '-00'), ('00.5', '00.5'), ('bare-point', '1.'), ('plus', '+1')]:
    raw_header('bad-number-%s' % name, with_field(value), blob, want='is not a JSON number')
extra = ('note', '{"dtype":"U8","shape":[0],"data_offsets":[%d,%d]}' % (len(blob), len(blob)))
raw_header('bad-raw-tab', obj(parts + [('extra\tname', extra[1])]), blob,
           want='raw control character U+0009 inside a string')
raw_header('bad-raw-newline',
           obj([('__metadata__', '{"producer":"line\nbreak"}')] + parts), blob,
           want='raw control character U+000A inside a string')
raw_header('bad-raw-ctrl', obj(parts + [('extra\x01', extra[1])]), blob,
           want='raw control character U+0001 inside a string')
raw_header('good-escaped-ctrl',  # escaped, they are JSON: a name like any other
           obj(parts + [('extra\\t\\u0001', extra[1])]), blob)

# names, dtypes and metadata values reach the terminal escaped: an escape
# sequence or a newline in them once set the window title, cleared the
# screen or forged a line of the report
hostile = '\\u001b]0;title\\u0007\\n beammoe audit: PASS\\u001b[2J'
raw_header('hostile-name', obj(parts + [(hostile, extra[1])]), blob)
raw_header('hostile-dtype',
           obj([parts[0], (parts[1][0], parts[1][1].replace('"F32"', '"%s"' % hostile))]), blob)
raw_header('hostile-meta',
           obj([('__metadata__', '{"routed_scale":"%s"}' % hostile)] + parts), blob)
raw_header('hostile-unknown', obj(parts + [(hostile, '[1]')]), blob)
raw_header('hostile-\x1b[2J\x07', obj(parts + [(hostile, '[1]')]), blob)
open(os.path.join(d, 'expected'), 'w').write(''.join(expected))
EOF
    # the files above, each with the status and words its audit must give
    while read -r code name words <&3; do
        expect_input "$code" "$tmp/$name.safetensors" "$words"
    done 3<"$tmp/expected"
    expect_input 2 "$tmp/absent.safetensors" "cannot open"
    expect_input 2 "$tmp" "not a regular file"
    expect_input 0 "$tmp/good-escaped-ctrl.safetensors"
    grep -q "note: tensor 'extra\\\\x09\\\\x01' is not used" "$tmp/err"
    check "good-escaped-ctrl.safetensors: the note shows the name escaped"

    # hostile text: no raw ESC, BEL or newline of it in anything printed
    esc=$(printf '\033') bel=$(printf '\007')
    for f in hostile-name hostile-dtype hostile-meta hostile-unknown "hostile-${esc}[2J${bel}"; do
        "$tool" audit --input "$tmp/$f.safetensors" --quick >"$tmp/out" 2>"$tmp/err"
        rc=$?
        cat "$tmp/out" "$tmp/err" >"$tmp/all"
        name=$(printf '%s' "$f" | tr -c '[:alnum:]-' '?')
        if LC_ALL=C grep -q "[$esc$bel]" "$tmp/all" || grep -q "^ beammoe audit: PASS" "$tmp/all"; then
            fail "$name: raw text of the file reached the output (exit $rc):"
            od -c "$tmp/all" | head -8 | sed 's/^/    /'
        elif ! grep -q '\\x1b\]0;title\\x07\\x0a beammoe' "$tmp/all"; then
            fail "$name: the text is not shown escaped:"
            sed 's/^/    /' "$tmp/all" | tail -4
        else
            pass "$name: exit $rc, shown escaped: $(grep -h 'x1b' "$tmp/all" | head -1)"
        fi
    done

    # one flipped bit in a stored result: a mismatch, exit 1
    python3 - "$tmp/rt-fused.safetensors" "$tmp/flipped.safetensors" <<'EOF'
import json, struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
b[8 + n + h['hidden']['data_offsets'][0] + 1] ^= 0x01
open(sys.argv[2], 'wb').write(b)
EOF
    expect_input 1 "$tmp/flipped.safetensors"
    grep -q "stored:hidden .*MISMATCH" "$tmp/out"
    check "flipped.safetensors: a MISMATCH row for stored:hidden"
else
    echo "note: no python3; only the run --output round trip was checked"
fi

# The header is read and checked before the data: a bad header in front of
# 4 GiB (a sparse file) is refused under a 1 GiB address-space limit. The
# reader once read the whole file into memory first ("out of memory reading
# 4294967304 bytes" here). Not under AddressSanitizer, whose shadow memory
# needs more address space than that limit, nor where the file system
# cannot make a sparse file.
asan=no
for bin in "${builddir:-.}/tools/.libs/beammoe" "$tool"; do
    if [ -f "$bin" ] && ldd "$bin" 2>/dev/null | grep -q libasan; then asan=yes; fi
done
big="$tmp/bad-header-4GiB.safetensors"
printf '\010\000\000\000\000\000\000\000{"a":[1 ' >"$big"
if [ "$asan" = yes ]; then
    echo "note: AddressSanitizer build: the 4 GiB file under a 1 GiB limit was not tried"
elif ! (ulimit -v 1048576) 2>/dev/null; then
    echo "note: this shell has no ulimit -v: the 4 GiB file was not tried"
elif ! truncate -s 4G "$big" 2>/dev/null || [ "$(du -k "$big" | cut -f1)" -gt 1024 ]; then
    echo "note: no sparse files here: the 4 GiB file was not tried"
else
    (ulimit -v 1048576 && exec "$tool" audit --input "$big") >/dev/null 2>"$tmp/err"
    rc=$?
    [ "$rc" = 2 ] && grep -q "bad header JSON" "$tmp/err"
    check "${big##*/}: exit $rc, 2 expected with 'bad header JSON' (header first)"
fi
rm -f "$big"

# Reading a header takes a small multiple of its size, whatever it holds:
# a header of a million empty objects ({"x":[{},{},...]}) once made the tool
# take 260 times its size (json-c's tree), a header of many small tensor
# entries 28 times. Each 4 MiB header below must be refused with a peak
# resident size under that of a tiny refused file plus 6 times the header.
# The peak is measured by GNU time where it is there and not under
# AddressSanitizer (its shadow memory would count); else only the refusal.
if command -v python3 >/dev/null 2>&1; then
    python3 - "$tmp" <<'EOF'
import struct, sys
d, size = sys.argv[1], 4 << 20
def write(name, js):
    js += b' ' * (-len(js) % 8)
    open('%s/%s.safetensors' % (d, name), 'wb').write(struct.pack('<Q', len(js)) + js)
def fill(head, item, tail):
    parts, n, i = [], len(head) + len(tail), 0
    while n < size:
        parts.append(item(i))
        n += len(parts[-1]) + 1
        i += 1
    return head + b','.join(parts) + tail
write('mem-objects', fill(b'{"x":[', lambda i: b'{}', b']}'))
write('mem-arrays', fill(b'{"x":[', lambda i: b'[]', b']}'))
write('mem-shape', fill(b'{"x":{"dtype":"U8","shape":[', lambda i: b'1', b'],"data_offsets":[0,1]}}'))
write('mem-entries', fill(b'{', lambda i: b'"%x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}' % i,
                          b'}'))
write('mem-metadata', fill(b'{"__metadata__":{', lambda i: b'"%x":""' % i, b'}}'))
write('mem-tiny', b'{"x":[{}]}')
EOF
    peak() { # peak resident KiB of audit --input FILE, or nothing
        /usr/bin/time -f 'peak %M' "$tool" audit --input "$1" >/dev/null 2>"$tmp/peak.err"
        sed -n 's/^peak \([0-9]*\)$/\1/p' "$tmp/peak.err" | tail -1
    }
    base=""
    if [ "$asan" = no ] && [ -x /usr/bin/time ] && /usr/bin/time -f 'peak %M' true 2>/dev/null; then
        base=$(peak "$tmp/mem-tiny.safetensors")
    fi
    [ -z "$base" ] && echo "note: no GNU time here, or an AddressSanitizer build: peak memory not measured"
    for f in "mem-objects:must be an object" "mem-arrays:must be an object" \
        "mem-shape:dimensions (at most 8)" "mem-entries:missing tensor 'expert_outputs'" \
        "mem-metadata:missing tensor 'expert_outputs'"; do
        name=${f%%:*} words=${f#*:}
        file="$tmp/$name.safetensors"
        timeout 60 "$tool" audit --input "$file" >/dev/null 2>"$tmp/err"
        rc=$?
        if [ "$rc" != 2 ] || ! grep -q -- "$words" "$tmp/err"; then
            fail "$name: exit $rc, expected 2 with '$words'"
            continue
        fi
        if [ -z "$base" ]; then
            pass "$name: exit 2 $(head -1 "$tmp/err" | cut -c1-100)"
            continue
        fi
        hkib=$(($(wc -c <"$file") / 1024))
        kib=$(peak "$file")
        if [ -z "$kib" ] || [ "$kib" -gt $((base + 6 * hkib)) ]; then
            fail "$name: peak ${kib:-?} KiB for a $hkib KiB header (limit $((base + 6 * hkib)) KiB)"
        else
            pass "$name: exit 2, peak $kib KiB for a $hkib KiB header (a tiny file: $base KiB)"
        fi
    done
    rm -f "$tmp"/mem-*.safetensors
fi

finish
