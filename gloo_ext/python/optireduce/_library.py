"""Finds and loads liboptireduce_torch.so; declares its C API (gloo_ext/c_api.h)."""

import ctypes
import json
import os
import sys

_LIB_NAME = "liboptireduce_torch.so"
_ABI_VERSION = 1
_library = None
_library_path = None


class ConfigError(RuntimeError):
    """An optireduce environment variable has a value that is not allowed."""


def _candidates():
    env = os.environ.get("OPTIREDUCE_TORCH_LIB")
    if env:
        # An explicit choice: no fallback that could load a different build.
        if not os.path.isfile(env):
            raise ImportError(f"optireduce: OPTIREDUCE_TORCH_LIB={env!r} is not a file")
        return [env]
    found = []
    try:
        from ._install_paths import LIBRARY  # written by `cmake --install`

        found.append(LIBRARY)
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    found.append(os.path.join(here, _LIB_NAME))
    return [p for p in found if os.path.isfile(p)] + [_LIB_NAME]  # last: ld.so's search


def _already_loaded():
    """The library if it is in the process already (LD_PRELOAD or an earlier import)."""
    process = ctypes.CDLL(None)
    try:
        process.optireduce_torch_abi_version
    except AttributeError:
        return None
    return process


def _declare(lib):
    c = ctypes
    p = c.c_void_p
    lib.optireduce_torch_abi_version.restype = c.c_int
    lib.optireduce_torch_version.restype = c.c_char_p
    lib.optireduce_last_error.restype = c.c_char_p
    lib.optireduce_free.argtypes = [p]
    lib.optireduce_config_check.restype = c.c_int
    lib.optireduce_config_json.restype = p
    lib.optireduce_stats_json.restype = p
    lib.optireduce_reset_stats.restype = None
    lib.optireduce_is_interposed.restype = c.c_int
    lib.optireduce_have_dpdk.restype = c.c_int
    lib.optireduce_redis_open.restype = p
    lib.optireduce_redis_open.argtypes = [c.c_char_p, c.c_char_p, c.c_char_p, c.c_int,
                                          c.c_int64, c.c_int64]
    lib.optireduce_redis_close.argtypes = [p]
    lib.optireduce_redis_set.argtypes = [p, c.c_char_p, c.c_char_p, c.c_size_t]
    lib.optireduce_redis_get.argtypes = [p, c.c_char_p, c.c_int64, c.POINTER(p),
                                         c.POINTER(c.c_size_t)]
    lib.optireduce_redis_add.argtypes = [p, c.c_char_p, c.c_int64, c.POINTER(c.c_int64)]
    lib.optireduce_redis_compare_set.argtypes = [p, c.c_char_p, c.c_char_p, c.c_size_t,
                                                 c.c_char_p, c.c_size_t, c.POINTER(p),
                                                 c.POINTER(c.c_size_t)]
    lib.optireduce_redis_check.argtypes = [p, c.POINTER(c.c_char_p), c.c_size_t,
                                           c.POINTER(c.c_int)]
    lib.optireduce_redis_wait.argtypes = [p, c.POINTER(c.c_char_p), c.c_size_t, c.c_int64]
    lib.optireduce_redis_delete_key.argtypes = [p, c.c_char_p, c.POINTER(c.c_int)]
    lib.optireduce_redis_num_keys.argtypes = [p, c.POINTER(c.c_int64)]


def _load():
    global _library, _library_path
    lib = _already_loaded()
    if lib is not None:
        _library_path = "(already loaded, e.g. LD_PRELOAD)"
    else:
        if "torch" in sys.modules:
            raise ImportError(
                "optireduce: `import optireduce` must come before `import torch`: torch is "
                "already imported, so its gloo::allreduce is bound to stock Gloo and "
                "optireduce would silently do nothing. Move `import optireduce` to the top "
                "of the program, or run with LD_PRELOAD=<prefix>/lib/" + _LIB_NAME)
        errors = []
        for path in _candidates():
            try:
                # RTLD_GLOBAL: torch, loaded later, must bind gloo::allreduce to this
                # library and see its c10d device registration.
                lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
                _library_path = path
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        if lib is None:
            raise ImportError(
                "optireduce: cannot load " + _LIB_NAME + " (set OPTIREDUCE_TORCH_LIB to its "
                "path); tried: " + "; ".join(errors))
    _declare(lib)
    abi = lib.optireduce_torch_abi_version()
    if abi != _ABI_VERSION:
        raise ImportError(f"optireduce: {_library_path} has C API version {abi}, this "
                          f"package needs {_ABI_VERSION}: reinstall both from one build")
    _library = lib
    if lib.optireduce_config_check() != 0:
        raise ConfigError(last_error())


def library():
    """The loaded ctypes library."""
    return _library


def library_path():
    """Path of the loaded liboptireduce_torch.so."""
    return _library_path


def last_error():
    return _library.optireduce_last_error().decode("utf-8", "replace")


def json_call(fn):
    """Calls a C function returning malloc'd JSON text; returns the parsed object."""
    ptr = fn()
    if not ptr:
        raise ConfigError(last_error())
    try:
        return json.loads(ctypes.string_at(ptr).decode("utf-8"))
    finally:
        _library.optireduce_free(ptr)


_load()
