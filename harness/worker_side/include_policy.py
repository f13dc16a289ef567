"""What a kernel source may #include, and what to write instead of a header NVRTC does not have.

Pure (no NVRTC). `check_includes` is one of every compile's policy checks (nvrtc.check_request, made
in the parent before a worker starts and again in the worker): an include that names a file outside
the CUDA header folders is refused before anything compiles, with one line saying why. What keeps
such a file out of reach is the compile worker's confinement (sandbox/confine.py); this check is
defence in depth, and an answer the agent can act on instead of a compiler error.

Seen: the #include, #include_next, #import and #embed directives (also spelled with the `%:` digraph
or the `??=` trigraph, split by line continuations, or with comments inside) and the
__has_include, __has_include_next and __has_embed operators. Refused: an absolute path, a path with
a `..` component, and a header name that is not written out and closed in quotes or angle brackets
(a macro or a stringized token: a computed include). The source is read in one linear pass. Not
seen: `__has_include` assembled by token pasting (`a##b`); it answers one bit, whether a file
exists, and the confinement hides every file outside the header folders from it.

`missing_header_advice` turns NVRTC's "cannot open source file" into one line per header saying what
to write instead (NVRTC has no C or C++ standard library headers; libcu++ has most of them as
<cuda/std/...>, and printf, malloc, memcpy, assert and the math functions are built in).
"""

from __future__ import annotations

import os
import re

from harness.worker_side.compile_policy import CompileRefused

# Where a comment or a literal (inside which `/*`, `//` and `#include` are just text) may start.
_LEXEME_START = re.compile(r"""//|/\*|R"|"|'""")
_RAW_OPENING = re.compile(r'R"([^()\\\s"]{0,16})\(')
_QUOTED = {'"': re.compile(r'"(?:\\.|[^"\\\n])*"?'), "'": re.compile(r"'(?:\\.|[^'\\\n])*'?")}
_CONTINUATION = re.compile(r"\\[ \t]*\r?\n")
_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:)[ \t]*(include_next|include|import|embed)\b[ \t]*", re.M)
_OPERATOR = re.compile(r"\b(__has_include_next|__has_include|__has_embed)\b[ \t]*(\()?[ \t]*")
# `#ifdef __has_include`, `defined(__has_include)`: asking whether the operator exists reads no file.
_ASKS_WHETHER_DEFINED = re.compile(r"(\bdefined[ \t]*\(?|^[ \t]*(?:#|%:)[ \t]*(?:ifdef|ifndef|undef))[ \t]*$")
_CLOSING = {'"': '"', "<": ">"}
_MAX_NAME_CHARS = 4096   # PATH_MAX: a longer name is no header's
_LOOK_BEHIND_CHARS = 80


def _logical_text(source: str) -> tuple[str, str]:
    """The source as the preprocessor reads its directives (trigraphs of -std=c++11/14 replaced, continued
    lines joined, each comment one space), and the same text with every literal's inside blanked out.
    One pass, linear in the source's length: the parent runs this on every request."""
    text = _CONTINUATION.sub("", source.replace("??=", "#").replace("??/", "\\"))
    plain, masked, position = [], [], 0
    while (found := _LEXEME_START.search(text, position)) is not None:
        start, opener = found.start(), found.group()
        if opener == 'R"' and not _RAW_OPENING.match(text, start):
            start, opener = start + 1, '"'   # an R before an ordinary string
        end = _lexeme_end(text, start, opener)
        plain.append(text[position:start])
        masked.append(text[position:start])
        if opener in ("//", "/*"):
            plain.append(" ")
            masked.append(" ")
        else:
            lexeme = text[start:end]
            plain.append(lexeme)
            masked.append(_blanked(lexeme))
        position = end
    plain.append(text[position:])
    masked.append(text[position:])
    return "".join(plain), "".join(masked)


def _lexeme_end(text: str, start: int, opener: str) -> int:
    """Where the comment or literal starting at text[start] ends (the end of the text if it does not)."""
    if opener == "//":
        end = text.find("\n", start)
        return len(text) if end < 0 else end
    if opener == "/*":
        end = text.find("*/", start + 2)
        return len(text) if end < 0 else end + 2
    if opener == 'R"':
        delimiter = _RAW_OPENING.match(text, start)
        closing = f'){delimiter.group(1)}"'
        end = text.find(closing, delimiter.end())
        return len(text) if end < 0 else end + len(closing)
    return _QUOTED[opener].match(text, start).end()


def _blanked(lexeme: str) -> str:
    """A literal with its first and last characters kept and spaces between (its newlines kept too)."""
    if len(lexeme) < 2:
        return lexeme
    inside = lexeme[1:-1]
    return lexeme[0] + (re.sub(r"[^\n]", " ", inside) if "\n" in inside else " " * len(inside)) + lexeme[-1]


def _header_name(text: str, start: int) -> str | None:
    """The name in `"name"` or `<name>` at text[start], None when it is not written out and closed."""
    closing = _CLOSING.get(text[start:start + 1])
    if closing is None:
        return None
    window = text[start + 1:start + 1 + _MAX_NAME_CHARS]
    end = window.find(closing)
    if end < 0 or "\n" in window[:end]:
        return None
    return window[:end]


def _why_refused(name: str | None) -> str | None:
    if name is None:
        return ("the file name is not written out between quotes or angle brackets (a macro makes it, or it "
                "is not closed); write the header's name, e.g. #include <cuda_fp16.h>")
    if name.startswith("/"):
        return "it names a file by absolute path; only the CUDA headers can be included, by name (e.g. <cuda_fp16.h>)"
    if ".." in re.split(r"[/\\]", name):
        return "its path climbs out with '..'; only the CUDA headers can be included, by name (e.g. <cuda_fp16.h>)"
    return None


def check_includes(source: str) -> None:
    """Raise CompileRefused for an include (or __has_include) of a file outside the include path."""
    text, masked = _logical_text(source)
    for match in _DIRECTIVE.finditer(masked):
        why = _why_refused(_header_name(text, match.end()))
        if why is not None:
            raise CompileRefused(f"{_quoted(text, match.start())} is refused: {why}")
    for match in _OPERATOR.finditer(masked):
        if match.group(2) is None and _asks_whether_defined(masked, match.start()):
            continue
        why = _why_refused(_header_name(text, match.end()) if match.group(2) else None)
        if why is not None:
            raise CompileRefused(f"{_quoted(text, match.start())} is refused: {why}")


def _asks_whether_defined(masked: str, start: int) -> bool:
    """Whether what precedes the operator on its line is `defined(` or `#ifdef` (read within a few words)."""
    behind = masked[max(0, start - _LOOK_BEHIND_CHARS):start]
    line = behind.rsplit("\n", 1)
    # A look-behind that does not reach the line's start cannot see a directive there.
    return _ASKS_WHETHER_DEFINED.search(line[-1] if len(line) > 1 or start <= _LOOK_BEHIND_CHARS
                                        else "x" + line[-1]) is not None


def _quoted(text: str, start: int) -> str:
    """The directive or operator and what follows it on its line, as the preprocessor reads them."""
    return repr(text[start:start + 120].split("\n", 1)[0].strip())


# ---------------------------------------------------------------- headers NVRTC does not have

_PRINTF = "printf is built in; remove the include"
_INTS = "write #include <cuda/std/cstdint> (int32_t, uint64_t, ... also in the global namespace)"
_MATH = ("the CUDA math functions (sqrtf, expf, fmaxf, isnan, ...) are built in; remove the include "
         "(<math_constants.h> has CUDART_INF_F and CUDART_PI_F; <cuda/std/cmath> has cuda::std:: versions)")
_STDLIB = "device malloc, free and abs are built in; remove the include (or write #include <cuda/std/cstdlib>)"
_STRING = "memcpy and memset are built in; remove the include"
_STDDEF = "size_t is built in; write #include <cuda/std/cstddef> for the rest"
_LIMITS = "write #include <cuda/std/climits> (INT_MAX, UINT_MAX, CHAR_BIT, ...)"
_FLOAT = ("write #include <cuda/std/limits> and use cuda::std::numeric_limits<float>::max() and friends "
          "(FLT_MAX is not defined)")
_ASSERT = "assert is built in; remove the include"
_HOST = "it is a host C++ header and device code cannot use it; remove the include"
ADVICE = {
    "cstdio": _PRINTF, "stdio.h": _PRINTF,
    "cstdint": _INTS, "stdint.h": _INTS, "cinttypes": _INTS, "inttypes.h": _INTS,
    "cmath": _MATH, "math.h": _MATH,
    "cstdlib": _STDLIB, "stdlib.h": _STDLIB,
    "cstring": _STRING, "string.h": _STRING,
    "cstddef": _STDDEF, "stddef.h": _STDDEF,
    "climits": _LIMITS, "limits.h": _LIMITS,
    "cfloat": _FLOAT, "float.h": _FLOAT,
    "cassert": _ASSERT, "assert.h": _ASSERT,
    "algorithm": "min and max are built in; remove the include (or use cuda::std::min from <cuda/std/utility>)",
    "cuda.h": "it is the host driver API, which a kernel does not need; remove the include (or write <cuda_runtime.h>)",
    **{name: _HOST for name in ("iostream", "fstream", "sstream", "vector", "string", "map", "unordered_map",
                                "set", "list", "deque", "memory", "thread", "mutex", "random")},
}
# `file(line): catastrophic error: cannot open source file "name"` (a permission error says more).
# NVRTC names the source itself kernel.cu (nvrtc.py).
_CANNOT_OPEN = re.compile(r'^(.*?)\(\d+\): catastrophic error: cannot open source file "([^"]+)"\s*$', re.M)
_PRIMARY_FILE = "kernel.cu"
_HOST_LIBRARIES = ("thrust/",)


def missing_header_advice(log: str, include_folders: tuple[str, ...]) -> list[str]:
    """One line per header NVRTC could not find, saying what to write instead."""
    lines = []
    for where, name in _CANNOT_OPEN.findall(log):
        if where == _PRIMARY_FILE:
            lines.append(f"<{name}> is not available under NVRTC: {_advice(name, include_folders)}")
            continue
        header = _on_path(where, include_folders)   # a CUDA header the source includes needs `name`
        if header in ADVICE or header.startswith(_HOST_LIBRARIES):
            lines.append(f"<{header}> is not available under NVRTC: {_advice(header, include_folders)}")
        else:
            lines.append(f"<{header}> needs <{name}>, which NVRTC does not have: include a narrower header "
                         "or remove the one that brings it in")
    return list(dict.fromkeys(lines))


def _on_path(path: str, include_folders: tuple[str, ...]) -> str:
    """`path` as the name an #include would give it, e.g. 'cuda.h' for /usr/local/cuda/include/cuda.h."""
    for folder in sorted(include_folders, key=len, reverse=True):   # the innermost folder first
        if path.startswith(folder.rstrip("/") + "/"):
            return path[len(folder.rstrip("/")) + 1:]
    return path


def _advice(name: str, include_folders: tuple[str, ...]) -> str:
    if name in ADVICE:
        return ADVICE[name]
    if "/" not in name and "." not in name and any(
            os.path.isfile(os.path.join(folder, "cuda", "std", name)) for folder in include_folders):
        return f"write #include <cuda/std/{name}> and use cuda::std::"
    if name.startswith(_HOST_LIBRARIES):
        return ("Thrust is a host library; in a kernel use CUB's block and warp headers "
                "(<cub/block/...>, <cub/warp/...>) or <cuda/std/...>")
    return ("the include path holds only the CUDA runtime headers and CCCL (CUB, libcu++ as <cuda/std/...>); "
            "remove the include")
