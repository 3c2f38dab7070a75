"""optireduce.RedisStore: a torch.distributed.Store on Redis.

    store = optireduce.RedisStore("redis://:secret@10.0.0.5:6379", job_id="job42",
                                  world_size=8)
    torch.distributed.init_process_group("gloo", store=store, rank=r, world_size=8)

Backed by the C++ RedisKv (rendezvous/redis_kv.h) through liboptireduce_torch.so: every key
lives under a job- and run-unique prefix with a TTL, and the last rank to close() deletes
the run's keys. Semantics follow torch's stores: get() waits for a missing key up to the
store timeout, wait(keys[, timeout]) waits for all keys, add() creates keys at 0.
"""

import ctypes
import datetime
import os

import torch.distributed as dist

from ._library import last_error, library

_DEADLINE_EXCEEDED = 4  # absl::StatusCode::kDeadlineExceeded


class StoreTimeoutError(RuntimeError):
    """A key did not appear within the timeout."""


def _bytes(value):
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


def _millis(timeout):
    if timeout is None:
        return 0
    if isinstance(timeout, datetime.timedelta):
        return max(1, int(timeout.total_seconds() * 1000))
    return max(1, int(float(timeout) * 1000))  # seconds


class RedisStore(dist.Store):
    def __init__(self, url=None, job_id=None, world_size=None, run_id=None,
                 timeout=datetime.timedelta(minutes=5),
                 connect_timeout=datetime.timedelta(seconds=5)):
        """url: redis://[[user:]password@]host[:port][/db] (default: OPTIREDUCE_REDIS_URL).
        job_id: names the job (no '/' or whitespace). world_size: ranks using the store.
        run_id: optional nonce of this run (default OPTIREDUCE_RUN_ID, else agreed by a
        join counter). timeout: default for get()/wait(), like torch's stores."""
        super().__init__()
        url = url or os.environ.get("OPTIREDUCE_REDIS_URL")
        if not url:
            raise ValueError("optireduce.RedisStore: no url given and OPTIREDUCE_REDIS_URL "
                             "is not set")
        if not job_id:
            raise ValueError("optireduce.RedisStore: job_id is required")
        if world_size is None or int(world_size) <= 0:
            raise ValueError(f"optireduce.RedisStore: world_size must be > 0, got "
                             f"{world_size!r}")
        run_id = run_id if run_id is not None else os.environ.get("OPTIREDUCE_RUN_ID", "")
        self._lib = library()
        self.set_timeout(timeout)
        handle = self._lib.optireduce_redis_open(
            url.encode(), str(job_id).encode(), str(run_id).encode(), int(world_size),
            _millis(timeout), _millis(connect_timeout))
        if not handle:
            raise RuntimeError(f"optireduce.RedisStore: {last_error()}")
        self._handle = handle

    # -- helpers ---------------------------------------------------------------------
    def _check(self, rc, what):
        if rc == 0:
            return
        message = f"optireduce.RedisStore.{what}: {last_error()}"
        if rc == _DEADLINE_EXCEEDED:
            raise StoreTimeoutError(message)
        raise RuntimeError(message)

    def _h(self):
        if not getattr(self, "_handle", None):
            raise RuntimeError("optireduce.RedisStore is closed")
        return self._handle

    def _take(self, ptr, length):
        try:
            return ctypes.string_at(ptr, length.value)
        finally:
            self._lib.optireduce_free(ptr)

    @staticmethod
    def _key_array(keys):
        if isinstance(keys, str):
            keys = [keys]
        encoded = [k.encode("utf-8") for k in keys]
        return (ctypes.c_char_p * len(encoded))(*encoded), len(encoded)

    # -- torch.distributed.Store API ------------------------------------------------
    def set(self, key, value):
        data = _bytes(value)
        self._check(self._lib.optireduce_redis_set(self._h(), key.encode(), data, len(data)),
                    f"set({key!r})")

    def get(self, key):
        ptr, length = ctypes.c_void_p(), ctypes.c_size_t()
        self._check(self._lib.optireduce_redis_get(self._h(), key.encode(),
                                                   _millis(self.timeout), ctypes.byref(ptr),
                                                   ctypes.byref(length)), f"get({key!r})")
        return self._take(ptr, length)

    def add(self, key, value):
        result = ctypes.c_int64()
        self._check(self._lib.optireduce_redis_add(self._h(), key.encode(), int(value),
                                                   ctypes.byref(result)), f"add({key!r})")
        return result.value

    def compare_set(self, key, expected_value, desired_value):
        expected, desired = _bytes(expected_value), _bytes(desired_value)
        ptr, length = ctypes.c_void_p(), ctypes.c_size_t()
        self._check(self._lib.optireduce_redis_compare_set(
            self._h(), key.encode(), expected, len(expected), desired, len(desired),
            ctypes.byref(ptr), ctypes.byref(length)), f"compare_set({key!r})")
        return self._take(ptr, length)

    def check(self, keys):
        array, n = self._key_array(keys)
        result = ctypes.c_int()
        self._check(self._lib.optireduce_redis_check(self._h(), array, n,
                                                     ctypes.byref(result)), "check")
        return bool(result.value)

    def wait(self, keys, timeout=None):
        array, n = self._key_array(keys)
        millis = _millis(timeout if timeout is not None else self.timeout)
        self._check(self._lib.optireduce_redis_wait(self._h(), array, n, millis),
                    f"wait({list(keys) if not isinstance(keys, str) else [keys]})")

    def delete_key(self, key):
        existed = ctypes.c_int()
        self._check(self._lib.optireduce_redis_delete_key(self._h(), key.encode(),
                                                          ctypes.byref(existed)),
                    f"delete_key({key!r})")
        return bool(existed.value)

    def num_keys(self):
        result = ctypes.c_int64()
        self._check(self._lib.optireduce_redis_num_keys(self._h(), ctypes.byref(result)),
                    "num_keys")
        return result.value

    # torch's C++ trampoline looks some methods up by their C++ names.
    def deleteKey(self, key):  # noqa: N802
        return self.delete_key(key)

    def getNumKeys(self):  # noqa: N802
        return self.num_keys()

    def compareSet(self, key, expected_value, desired_value):  # noqa: N802
        return self.compare_set(key, expected_value, desired_value)

    def close(self):
        """This rank is done; the last rank to close deletes the run's keys."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._check(self._lib.optireduce_redis_close(handle), "close")

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
