"""One checked path for every CUDA driver and NVRTC call.

cuda.bindings calls return a tuple whose first element is a status enum
(driver.CUresult or nvrtc.nvrtcResult) followed by the outputs. `check`
turns a failed status into a CudaError that names the call, so a failure
far from its cause still says which call broke.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CudaError", "check"]


class CudaError(RuntimeError):
    """A CUDA driver or NVRTC call failed."""

    def __init__(self, call: str, code: int, name: str, detail: str = "") -> None:
        self.call = call
        self.code = int(code)
        self.name = name
        self.detail = detail
        message = f"{call} failed: {name} ({self.code})"
        if detail and detail != name:
            message += f": {detail}"
        super().__init__(message)

    def __reduce__(self):
        # The default reduce would rebuild from the formatted message alone,
        # which breaks crossing a process boundary (sandboxed workers).
        return (type(self), (self.call, self.code, self.name, self.detail))


def check(result: Any, call: str) -> Any:
    """Raise CudaError if `result` reports failure, else unwrap its values.

    Returns None for a bare status, the single value for (status, value),
    and the remaining values as a tuple when there are several.
    """
    if isinstance(result, tuple):
        status, values = result[0], result[1:]
    else:
        status, values = result, ()
    if int(status) != 0:
        name, detail = _describe(status)
        raise CudaError(call, int(status), name, detail)
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return tuple(values)


def _describe(status: Any) -> tuple[str, str]:
    """(error name, human description) for a failed status of either API."""
    fallback = getattr(status, "name", None) or f"error {int(status)}"
    kind = type(status).__name__
    if kind == "nvrtcResult":
        return fallback, _nvrtc_description(status) or fallback
    if kind == "CUresult":
        return _driver_name(status) or fallback, _driver_description(status) or fallback
    return fallback, fallback


def _nvrtc_description(status: Any) -> str | None:
    try:
        from cuda.bindings import nvrtc  # may be absent where only compiling: the code is then named as it is

        text = nvrtc.nvrtcGetErrorString(status)[1]
    except Exception:
        return None
    return _text(text)


def _driver_name(status: Any) -> str | None:
    # The driver library is loaded lazily and is absent on build-only
    # machines; the enum's own name is then the best we can say.
    try:
        from cuda.bindings import driver  # may be absent where only compiling: the code is then named as it is

        err, text = driver.cuGetErrorName(status)
    except Exception:
        return None
    return _text(text) if int(err) == 0 else None


def _driver_description(status: Any) -> str | None:
    try:
        from cuda.bindings import driver  # may be absent where only compiling: the code is then named as it is

        err, text = driver.cuGetErrorString(status)
    except Exception:
        return None
    return _text(text) if int(err) == 0 else None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
