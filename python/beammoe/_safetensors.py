"""The safetensors reader of the audit (audit.py): a file read and checked
completely, with the C tool's rule and words (harness/safetensors.c,
harness/st_header.c, harness/st_case.c's metadata numbers).

The reader applies the rules of the C tool's (harness/safetensors.c and
harness/st_header.c), with its words: the header length is checked against
the file's size, then the header alone is read and checked completely, in
two passes that build no JSON tree (strict JSON, RFC 8259 as the format's
reference reader takes it: no NaN or Infinity, no leading zeros, no raw
control character in a string, no NUL or unpaired surrogate in any string;
then the schema: tensor entries of exactly dtype, shape and data_offsets,
__metadata__ of strings, no key twice, data_offsets tiling the data
section), so a hostile header is refused with a ValueError, never a
MemoryError; the tensor data is read only after that. The file's numbers
are never trusted: every offset and size is checked against the file first.
Names, dtypes, metadata values and the path are escaped in every message
(_escape), as the C tool escapes them (harness/text.c).

Why a reader of our own and not the `safetensors` package (the format's
reference reader) where it is installed: the audit's answer must not depend
on what else is installed, and the package gives another one. Measured with
safetensors 0.8.0, its safe_open:
- accepts files that both of our readers refuse: a field an entry does not
  have, a tensor name given twice (one entry kept), an entry written as an
  array ["F32", [2], [0, 8]], a NUL in a name, a metadata key given twice
  (the last kept), more than 8 dimensions; and refuses the others in its
  own words, where this reader answers the C tool's `audit --input` word for
  word (python/tests/test_audit_file.py compares them on mutated files);
- waits forever on a FIFO with no writer, where this reader refuses what is
  not a regular file at once;
- puts a tensor name or a dtype from the file into its message raw (an
  escape sequence reaches the terminal);
- takes 12 to 23 times a hostile header's size in memory (6 MB headers of
  empty objects or arrays, a shape of 2,000,000 dimensions, thousands of
  entries or metadata keys, unknown fields, a name repeated), where this
  reader, which builds no JSON tree, takes 2 to 9 times;
- is no dependency of this package, and Debian has no package of it.
Where it is installed, the test suite checks that it reads every file this
reader accepts, with the same tensors and bytes: this reader is only
stricter, but for -0 as an integer (a shape or an offset), which JSON's
grammar allows and both of our readers read as 0, and the package refuses.
"""
import ctypes
import json
import os
import re
import stat
import sys

import torch


# The format's dtypes and their sizes (harness/st_header.c: dtype_size).
_DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
_MAX_INT = 1 << 53          # largest shape/offset value accepted (as the C reader)
_MAX_HEADER = 100 * 1000 * 1000
_MAX_DIMS = 8


class _Tensor:
    """One header entry, checked against the data section."""
    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name, dtype, shape, begin, end):
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


# ---- text from the file, made safe to print (harness/text.c: hu_escape) ----

# Characters of U+0080 and above that are escaped: invisible, line-breaking
# or reordering ones a terminal or a reader would be fooled by.
_ESCAPED_CP = frozenset(list(range(0x80, 0xA0)) + list(range(0x200B, 0x2010)) + [0x2028, 0x2029] +
                        list(range(0x202A, 0x202F)) + list(range(0x2060, 0x206A)) + [0xFEFF])
_PLAIN_TEXT = re.compile(r"[ -\[\]-~]*\Z")  # printable ASCII but the backslash


def _escape(s, max_chars=None):
    """s made printable as the C tool prints it: a tensor name, a dtype, a
    metadata value or a path is the file's (or the caller's) text, and raw it
    could set the terminal's title, clear the screen or forge a line of the
    report. Backslash as \\\\, U+0000-U+001F and U+007F as \\xNN, the
    characters of _ESCAPED_CP as \\uNNNN, a byte os.fsdecode could not decode
    (U+DC80-U+DCFF) as \\xNN, anything else as itself; at most max_chars
    characters of s."""
    if max_chars is not None:
        s = s[:max_chars]
    if _PLAIN_TEXT.match(s):
        return s
    out = []
    for ch in s:
        c = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif c < 0x20 or c == 0x7F:
            out.append("\\x%02x" % c)
        elif 0xDC80 <= c <= 0xDCFF:
            out.append("\\x%02x" % (c - 0xDC00))
        elif c in _ESCAPED_CP or 0xD800 <= c <= 0xDFFF:
            out.append("\\u%04x" % c)
        else:
            out.append(ch)
    return "".join(out)


# ---- the header: the rule of harness/st_header.c, in its order and words.
# Two passes over the bytes, neither of which builds a JSON tree: the syntax
# (strict JSON, RFC 8259: no NaN or Infinity, no leading zeros, no raw
# control character inside a string, ...) stores nothing; the schema stores
# only what a header can hold (tensor entries of dtype, shape and
# data_offsets; __metadata__ of strings), so a header of a million empty
# objects is refused without a million dicts. ----

_MAX_DEPTH = 32             # objects and arrays nested in one another (st_header.h)
_WS = re.compile(rb"[ \t\n\r]*")
_RUN = re.compile(rb"[A-Za-z0-9.+-]*")   # what a fault names
# an RFC 8259 number, not followed by another letter, digit, sign or point
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?(?![A-Za-z0-9.+-])")
_WORD = re.compile(rb"(?:true|false|null)(?![A-Za-z0-9.+-])")
_FLAT_REST = re.compile(rb'[^\[\]{}"]*\]')  # the rest of an array that holds no string or container
_PLAIN_STRING = re.compile(rb'"[^"\\\x00-\x1f]*"')
_STRING_SPECIAL = re.compile(rb'[\\"\x00-\x1f]')     # what ends a run of plain text in a string
_STRING_END = re.compile(rb'[\\"]')
_RUN_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.+-")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET, _QUOTE, _COMMA, _COLON, _BACKSLASH = b'{}[]",:\\'


def _fault(msg):
    return ValueError(msg)


def _ws(h, i):
    return _WS.match(h, i).end()


def _end_fault():
    return _fault("bad header JSON: unexpected end of header")


def _value_fault(h, at):
    run = _RUN.match(h, at).group()
    if not run:
        return _fault("bad header JSON: expected a value (byte %d of the JSON)" % at)
    tok = run[:24].decode("ascii") + ("..." if len(run) > 24 else "")
    if run[0] in b"0123456789-+." or run.lower() in (b"nan", b"inf", b"infinity"):
        return _fault("bad header JSON: '%s' is not a JSON number: RFC 8259 has no NaN or Infinity, no "
                      "leading zeros, no '+', and digits on both sides of a '.' (byte %d of the JSON)"
                      % (tok, at))
    return _fault("bad header JSON: '%s' is not a JSON value (byte %d of the JSON)" % (tok, at))


def _number_end(h, i):
    """End of the RFC 8259 number at i, not followed by another letter,
    digit, sign or point; 0 when there is none."""
    m = _NUMBER.match(h, i)
    return m.end() if m else 0


def _syn_scalar(h, i):
    """End of the number or true, false, null (JSON's words are lower case) at i."""
    m = _NUMBER.match(h, i) or _WORD.match(h, i)
    if not m:
        raise _value_fault(h, i)
    return m.end()


def _surrogate_fault(at):
    return _fault("bad header: a string of the JSON has an unpaired UTF-16 surrogate escape, not valid "
                  "Unicode (byte %d of the JSON)" % at)


def _syn_string(h, i):
    """End of the string at i ('"'), checked as st_header.c's syn_string:
    raw control characters, escapes, \\u0000 and surrogate escapes. A
    search for the next special byte jumps over plain text (no per-byte
    loop, no regex state that grows with the string)."""
    m = _PLAIN_STRING.match(h, i)
    if m:
        return m.end()
    n, j, hi, hi_at = len(h), i + 1, False, 0
    while True:
        m = _STRING_SPECIAL.search(h, j)
        if not m:
            raise _end_fault()
        k = m.start()
        if hi and k > j:  # a character after a high surrogate escape
            raise _surrogate_fault(hi_at)
        ch = h[k]
        if ch < 0x20:
            raise _fault("bad header JSON: a raw control character U+%04X inside a string; JSON allows it "
                         "only escaped (byte %d of the JSON)" % (ch, k))
        if ch == _QUOTE:
            if hi:
                raise _surrogate_fault(hi_at)
            return k + 1
        if k + 1 >= n:
            raise _end_fault()
        ch = h[k + 1]
        if ch != 0x75:  # 'u'
            if hi:
                raise _surrogate_fault(hi_at)
            if ch not in _ESCAPES:
                if 0x20 < ch < 0x7F:
                    raise _fault("bad header JSON: an invalid escape '\\%c' in a string (byte %d of the JSON)"
                                 % (ch, k))
                raise _fault("bad header JSON: an invalid escape in a string (byte %d of the JSON)" % k)
            j = k + 2
            continue
        for d in range(4):
            if k + 2 + d >= n:
                raise _end_fault()
            if h[k + 2 + d] not in _HEX:
                raise _fault("bad header JSON: a \\u escape without four hex digits (byte %d of the JSON)" % k)
        v = int(h[k + 2:k + 6], 16)
        if v == 0:
            raise _fault("bad header: \\u0000 (NUL) inside a string of the JSON (byte %d of the JSON)" % k)
        if 0xD800 <= v <= 0xDBFF:
            if hi:
                raise _surrogate_fault(hi_at)
            hi, hi_at = True, k
        elif 0xDC00 <= v <= 0xDFFF:
            if not hi:
                raise _surrogate_fault(k)
            hi = False
        elif hi:
            raise _surrogate_fault(hi_at)
        j = k + 6


def _syntax(h):
    """Pass 1: the whole text is one strict JSON value and padding; stores
    nothing but the open containers. A state machine, as st_header.c's."""
    n, stack, ws = len(h), [], _WS.match
    i, state = ws(h, 0).end(), _VALUE
    while True:
        if state == _VALUE:
            if i >= n:
                raise _end_fault()
            ch = h[i]
            if ch == _LBRACE or ch == _LBRACKET:
                if len(stack) == _MAX_DEPTH:
                    raise _fault("bad header JSON: nesting too deep: more than %d levels (byte %d of the JSON)"
                                 % (_MAX_DEPTH, i))
                stack.append(ch)
                i = ws(h, i + 1).end()
                if i < n and h[i] == (_RBRACE if ch == _LBRACE else _RBRACKET):  # empty
                    i += 1
                    stack.pop()
                    state = _AFTER
                else:
                    state = _KEY if ch == _LBRACE else _VALUE
                continue
            i = _syn_string(h, i) if ch == _QUOTE else _syn_scalar(h, i)
            state = _AFTER
        elif state == _KEY:
            if i >= n:
                raise _end_fault()
            if h[i] != _QUOTE:
                raise _fault("bad header JSON: expected a string key (byte %d of the JSON)" % i)
            i = ws(h, _syn_string(h, i)).end()
            if i >= n:
                raise _end_fault()
            if h[i] != _COLON:
                raise _fault("bad header JSON: expected ':' after a key (byte %d of the JSON)" % i)
            i = ws(h, i + 1).end()
            state = _VALUE
        else:  # a value has ended
            i = ws(h, i).end()
            if not stack:
                if i < n:
                    raise _fault("bad header JSON: bytes after the top-level object (byte %d of the JSON)" % i)
                return
            if i >= n:
                raise _end_fault()
            ch, top = h[i], stack[-1]
            if ch == _COMMA:
                i = ws(h, i + 1).end()
                state = _KEY if top == _LBRACE else _VALUE
            elif ch == (_RBRACE if top == _LBRACE else _RBRACKET):
                i += 1
                stack.pop()
            elif top == _LBRACE:
                raise _fault("bad header JSON: expected ',' or '}' after a member (byte %d of the JSON)" % i)
            else:
                raise _fault("bad header JSON: expected ',' or ']' after an element (byte %d of the JSON)" % i)


_VALUE, _KEY, _AFTER = range(3)  # what the syntax expects next


class _Cursor:
    """Pass 2's place in text the syntax has passed."""
    __slots__ = ("h", "i")

    def __init__(self, h):
        self.h, self.i = h, 0

    def peek(self):
        return self.h[self.i] if self.i < len(self.h) else 0

    def ws(self):
        self.i = _WS.match(self.h, self.i).end()

    def skip_string(self):
        j = self.i + 1
        while True:
            k = _STRING_END.search(self.h, j).start()
            if self.h[k] == _QUOTE:
                self.i = k + 1
                return
            j = k + 2  # an escape: \\uXXXX's digits are plain text

    def skip_value(self):
        """Past the value here, whatever it holds, storing nothing."""
        self.ws()
        ch = self.peek()
        if ch == _QUOTE:
            self.skip_string()
            return
        if ch != _LBRACE and ch != _LBRACKET:
            self.i = _RUN.match(self.h, self.i).end()
            return
        m = _FLAT_REST.match(self.h, self.i + 1) if ch == _LBRACKET else None
        if m:  # an array of numbers and words: to its end at once
            self.i = m.end()
            return
        depth = 0
        while True:
            self.ws()
            ch = self.peek()
            if not ch:
                return
            if ch == _QUOTE:
                self.skip_string()
            elif ch == _LBRACE or ch == _LBRACKET:
                depth += 1
                self.i += 1
                continue
            elif ch == _RBRACE or ch == _RBRACKET:
                depth -= 1
                self.i += 1
            elif ch == _COMMA or ch == _COLON:
                self.i += 1
                continue
            else:
                self.i = _RUN.match(self.h, self.i).end()
            if depth <= 0:
                return

    def next_item(self):
        """Past the ',' or the closing bracket after a member or an element:
        True when another one follows."""
        self.ws()
        more = self.peek() == _COMMA
        self.i += 1
        if more:
            self.ws()
        return more

    def past_colon(self):
        self.ws()
        self.i += 1
        self.ws()

    def take_string(self):
        m = _PLAIN_STRING.match(self.h, self.i)
        if m:
            self.i = m.end()
            return self.h[m.start() + 1:m.end() - 1].decode("utf-8")
        start = self.i
        self.skip_string()
        return json.loads(self.h[start:self.i].decode("utf-8"))  # escapes; surrogate pairs joined

    def take_nonneg(self):
        """The value here as a non-negative integer <= 2**53, or None (not a
        number, a fraction or exponent, a negative, a larger one); "-0" is
        0. Moves past the value either way."""
        ch = self.peek()
        if ch not in _DIGITS and ch != 0x2D:
            self.skip_value()
            return None
        end = _number_end(self.h, self.i)
        tok, self.i = self.h[self.i:end], end
        if any(c in tok for c in b".eE"):
            return None
        digits = tok.lstrip(b"-")
        if len(digits) > 17:  # past 2**53 (and past Python's digit limit for int())
            return None
        v = int(digits)
        if v > _MAX_INT or (tok.startswith(b"-") and v != 0):
            return None
        return v

    def kind_name(self):
        """json-c's name for the kind of the value here, as the reader once said."""
        ch = self.peek()
        for k, name in ((_LBRACE, "object"), (_LBRACKET, "array"), (_QUOTE, "string"), (0x74, "boolean"),
                        (0x66, "boolean"), (0x6E, "null")):
            if ch == k:
                return name
        tok = self.h[self.i:_number_end(self.h, self.i)]
        return "double" if any(c in tok for c in b".eE") else "int"

    def container_length(self):
        """Elements of the array, or members of the object, here (stays)."""
        save, n, obj = self.i, 0, self.peek() == _LBRACE
        m = None if obj else _FLAT_REST.match(self.h, self.i + 1)
        if m:  # numbers and words only: its commas separate its elements
            body = self.h[self.i + 1:m.end() - 1]
            return body.count(b",") + 1 if body.strip(b" \t\n\r") else 0
        self.i += 1
        self.ws()
        if self.peek() != (_RBRACE if obj else _RBRACKET):
            while True:
                if obj:
                    self.skip_string()
                    self.past_colon()
                self.skip_value()
                n += 1
                if not self.next_item():
                    break
        self.i = save
        return n


_FIELDS = ("dtype", "shape", "data_offsets")


def _take_entry(c, name, dlen):
    """The entry of tensor `name` (value at c.i) against a data section of
    dlen bytes: its members read first (an unknown field or one given twice
    refused there), then checked in st_header.c's order."""
    nm = _escape(name)
    if c.peek() != _LBRACE:
        raise _fault("header: entry '%s' must be an object with dtype, shape, data_offsets" % nm)
    at = {}
    c.i += 1
    c.ws()
    if c.peek() == _RBRACE:
        c.i += 1
    else:
        while True:
            k = c.take_string()
            if k not in _FIELDS:
                raise _fault("header: tensor '%s' has an unknown field '%s'; an entry holds dtype, shape and "
                             "data_offsets only" % (nm, _escape(k)))
            if k in at:
                raise _fault("bad header JSON: a key appears twice inside the entry '%s'" % nm)
            c.past_colon()
            at[k] = c.i
            c.skip_value()
            if not c.next_item():
                break
    end = c.i

    c.i = at.get("dtype", 0)
    if "dtype" not in at or c.peek() != _QUOTE:
        raise _fault("header: tensor '%s' has no string \"dtype\"" % nm)
    dt = c.take_string()
    if dt not in _DTYPE_SIZE:
        raise _fault("header: tensor '%s' has unknown dtype \"%s\"" % (nm, _escape(dt, 20)))

    c.i = at.get("shape", 0)
    if "shape" not in at or c.peek() != _LBRACKET:
        raise _fault("header: tensor '%s' has no array \"shape\"" % nm)
    nd = c.container_length()
    if nd > _MAX_DIMS:
        raise _fault("header: tensor '%s' has %d dimensions (at most %d)" % (nm, nd, _MAX_DIMS))
    c.i += 1
    numel, shape = 1, []
    for d in range(nd):
        c.ws()
        v = c.take_nonneg()
        if v is None:
            raise _fault("header: tensor '%s': shape[%d] is not a non-negative integer" % (nm, d))
        if v and numel > _MAX_INT // v:
            raise _fault("header: tensor '%s': shape too large" % nm)
        numel *= v
        shape.append(v)
        c.next_item()

    c.i = at.get("data_offsets", 0)
    if "data_offsets" not in at or c.peek() != _LBRACKET or c.container_length() != 2:
        raise _fault("header: tensor '%s' has no \"data_offsets\": [begin, end]" % nm)
    c.i += 1
    c.ws()
    b = c.take_nonneg()
    c.next_item()
    en = c.take_nonneg()
    if b is None or en is None or en < b:
        raise _fault("header: tensor '%s': data_offsets must be integers 0 <= begin <= end" % nm)
    if en > dlen:
        raise _fault("truncated: tensor '%s' data_offsets end %d is past the end of the data (%d bytes)"
                     % (nm, en, dlen))
    if en - b != numel * _DTYPE_SIZE[dt]:
        raise _fault("tensor '%s': data_offsets span %d bytes, but %s x %d elements need %d"
                     % (nm, en - b, dt, numel, numel * _DTYPE_SIZE[dt]))
    c.i = end
    return _Tensor(name, dt, tuple(shape), b, en)


def _take_meta(c):
    """__metadata__ (value at c.i): an object of strings, no key twice."""
    if c.peek() != _LBRACE:
        raise _fault("header: __metadata__ must be an object of strings")
    count, meta = 0, {}
    c.i += 1
    c.ws()
    if c.peek() == _RBRACE:
        c.i += 1
        return meta
    while True:
        k = c.take_string()
        c.past_colon()
        if c.peek() != _QUOTE:
            raise _fault("header: __metadata__ value of '%s' must be a string" % _escape(k))
        count += 1
        meta[k] = c.take_string()
        if not c.next_item():
            break
    if len(meta) != count:
        raise _fault("bad header JSON: a key appears twice inside the entry '__metadata__'")
    return meta


def _parse_header(hb, dlen):
    """The header's bytes, checked as st_header.c checks them, in its order
    and with its words, against a data section of dlen bytes: (tensors
    {name: _Tensor} in the header's order, metadata {key: str})."""
    h = hb  # bytes or bytearray: read, never copied
    if b"\0" in h:
        raise _fault("bad header: NUL byte inside the JSON")
    try:
        h.decode("utf-8", errors="strict")  # overlong forms and encoded surrogates too
    except UnicodeDecodeError as e:
        raise _fault("bad header: not valid UTF-8 (byte %d of the JSON)" % e.start) from None
    _syntax(h)
    c = _Cursor(h)
    c.ws()
    if c.peek() != _LBRACE:
        raise _fault("bad header JSON: the top level must be an object, not %s" % c.kind_name())
    names, tensors, meta, meta_count = [], {}, {}, 0
    c.i += 1
    c.ws()
    if c.peek() != _RBRACE:
        while True:
            name = c.take_string()
            c.past_colon()
            names.append(name)
            if name == "__metadata__":
                meta_count += 1
                if meta_count == 1:
                    meta = _take_meta(c)
                else:
                    c.skip_value()  # only counted: a name twice is refused below
            else:
                tensors.setdefault(name, _take_entry(c, name, dlen))
            if not c.next_item():
                break
    # a name given twice: readers keep different entries of it
    if len(names) != len(tensors) + min(meta_count, 1):
        seen, twice = set(), set()
        for name in names:
            (twice if name in seen else seen).add(name)
        raise _fault("bad header JSON: the name '%s' appears twice"
                     % _escape(min(twice, key=lambda s: s.encode("utf-8"))))
    _check_tiling(list(tensors.values()), dlen)
    return tensors, meta


def _check_tiling(ts, dlen):
    """The tensors' spans, in offset order, must cover [0, dlen) once each,
    as the format's reference reader requires: otherwise two readers could
    see different bytes for one tensor, or bytes that belong to none."""
    at, prev = 0, None
    for i in sorted(range(len(ts)), key=lambda i: (ts[i].begin, ts[i].end, i)):
        t = ts[i]
        if t.begin < at:
            raise ValueError("bad data_offsets: tensor '%s' [%d, %d] overlaps tensor '%s', which ends at %d"
                             % (_escape(t.name), t.begin, t.end, _escape(prev.name), at))
        if t.begin > at:
            raise ValueError("bad data_offsets: bytes [%d, %d) of the data belong to no tensor (tensor '%s' "
                             "begins at %d)" % (at, t.begin, _escape(t.name), t.begin))
        at, prev = t.end, t
    if at != dlen:
        raise ValueError("bad data_offsets: the tensors cover %d bytes, but the data section after the "
                         "header has %d" % (at, dlen))


def _file_kind(mode):
    """The words of harness/safetensors.c (kind_name) for what is not a regular file."""
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def _open_regular(path):
    """(unbuffered file object, size) of `path` when it is a regular file,
    else ValueError at once.

    Opened with O_NONBLOCK, so a FIFO with no writer (or a device) never
    blocks the open; fstat of the open file, not a stat before it (which a
    rename could outrun), decides and gives the size; only a regular file
    is then read, with blocking reads."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ValueError("cannot open: %s" % e.strerror) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file (%s)" % _file_kind(st.st_mode))
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb", buffering=0)
        fd = -1  # the file object owns it now
        return f, st.st_size
    except OSError as e:
        raise ValueError("cannot open: %s" % e.strerror) from None
    finally:
        if fd >= 0:
            os.close(fd)


def _read_exact(f, n):
    """The next n bytes of f (a bytearray: torch.frombuffer warns on bytes),
    or ValueError with the C reader's words."""
    buf = bytearray(n)
    got = 0
    with memoryview(buf) as view:
        while got < n:
            try:
                r = f.readinto(view[got:])
            except OSError as e:
                raise ValueError("read error: %s" % e.strerror) from None
            if not r:
                raise ValueError("read error: the file shrank while it was read")
            got += r
    return buf


def read_safetensors(path):
    """(tensors {name: _Tensor}, metadata {key: str}, the data section's
    bytes). ValueError for anything the C reader rejects, same words.

    As the C reader: the 8-byte header length first, checked against the
    file's size (fstat); then the header alone, checked completely (strict
    JSON and UTF-8, no NUL or unpaired surrogate in any string, no key given
    twice at any depth, every entry, data_offsets tiling the data section);
    the data section is read only then, so a bad header in front of
    gigabytes is refused without reading them."""
    f, fsize = _open_regular(path)
    with f:
        if fsize < 8:
            raise ValueError("truncated: %d bytes, shorter than the 8-byte header length" % fsize)
        hlen = int.from_bytes(_read_exact(f, 8), "little")
        if hlen > fsize - 8:
            raise ValueError("truncated: header length %d is past the end of the file (%d bytes)"
                             % (hlen, fsize))
        if hlen > _MAX_HEADER or hlen < 2:
            raise ValueError("header length %d is not in [2, %d]" % (hlen, _MAX_HEADER))
        dlen = fsize - 8 - hlen
        tensors, meta = _parse_header(_read_exact(f, hlen), dlen)
        # the header holds: now the data section, exactly as long as it said
        data = _read_exact(f, dlen)
    return tensors, meta, data


def _torch(t, data):
    """An owned, aligned torch tensor of t's bytes (little-endian host)."""
    dtype = {"BF16": torch.bfloat16, "F32": torch.float32}[t.dtype]
    n = t.end - t.begin
    if n == 0:
        return torch.empty(t.shape, dtype=dtype)
    b = torch.frombuffer(data, dtype=torch.uint8, count=n, offset=t.begin).clone()
    if sys.byteorder != "little":
        b = b.view(-1, 2 if t.dtype == "BF16" else 4).flip(1).contiguous().view(-1)
    if t.dtype == "BF16":
        return b.view(torch.int16).view(torch.bfloat16).reshape(t.shape)
    return b.view(torch.float32).reshape(t.shape)


# ---- metadata: parsed by the C library's strtof, so the float is exactly
# the one the C tool reads ----

try:
    _libc = ctypes.CDLL(None)
    _libc.strtof.restype = ctypes.c_float
    _libc.strtof.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
except (OSError, AttributeError):  # no libc symbols: Python's parser, rounded to float32
    _libc = None


def _strtof(s):
    """(value, rest) like C strtof; value None when nothing was parsed."""
    if _libc is not None:
        buf = ctypes.create_string_buffer(s.encode("utf-8", "surrogateescape"))
        end = ctypes.c_char_p()
        v = _libc.strtof(buf, ctypes.byref(end))
        used = ctypes.cast(end, ctypes.c_void_p).value - ctypes.addressof(buf)
        if used == 0:
            return None, s
        return float(v), buf.raw[used:len(buf.raw) - 1].decode("utf-8", "surrogateescape")
    m = re.match(r"\s*[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)",
                 s, re.I)
    if not m:
        return None, s
    import struct
    return struct.unpack("<f", struct.pack("<f", float(m.group(0))))[0], s[m.end():]


def _meta_f32(meta, key):
    s = meta.get(key)
    if s is None:
        return None
    v, rest = _strtof(s)
    if v is None or rest:
        raise ValueError("metadata %s=\"%s\" is not a number" % (key, _escape(s, 40)))
    return v


def _meta_pair(meta, key):
    s = meta.get(key)
    if s is None:
        return None
    a, rest = _strtof(s)
    if a is not None and rest.startswith(","):
        b, rest2 = _strtof(rest[1:])
        if b is not None and not rest2:
            return (a, b)
    raise ValueError("metadata %s=\"%s\" is not two numbers \"a,b\"" % (key, _escape(s, 40)))


def _shape_text(shape):
    return "[" + ", ".join(str(d) for d in shape) + "]"
