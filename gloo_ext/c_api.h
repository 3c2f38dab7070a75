// The C API of liboptireduce_torch.so, for the Python package (ctypes) and other languages.
//
// Conventions: functions returning int return 0 on success and a nonzero absl status code
// on failure; the failure's message is then available from optireduce_last_error() on the
// same thread. Strings are NUL-terminated UTF-8 unless a length is passed. Buffers returned
// by the library are released with optireduce_free().
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPTIREDUCE_TORCH_ABI_VERSION 1

// ABI version of this C API (OPTIREDUCE_TORCH_ABI_VERSION) and library version string.
int optireduce_torch_abi_version(void);
const char* optireduce_torch_version(void);

// Message of the last failed call on this thread ("" if none).
const char* optireduce_last_error(void);
void optireduce_free(void* p);

// Parses the environment (gloo_ext/config.h). 0 if valid; else the error names the variable.
int optireduce_config_check(void);
// The parsed configuration as JSON (caller frees), or NULL on error.
char* optireduce_config_json(void);

// Interposer counters and OptiReduce statistics as one JSON object (caller frees):
// {"interposer": {...}, "optireduce": {...}, "interposed": true|false}
char* optireduce_stats_json(void);
void optireduce_reset_stats(void);
// 1 if this build has the DPDK device (GLOO_DEVICE_TRANSPORT=DPDK), else 0.
int optireduce_have_dpdk(void);
// 1 if the gloo::allreduce that the process (libtorch) binds to is this library's.
int optireduce_is_interposed(void);

// --- Redis key-value store for torch.distributed (rendezvous/redis_kv.h). ---
typedef struct optireduce_redis optireduce_redis;
// run_id may be NULL or "". Timeouts in milliseconds; <= 0 takes the default.
optireduce_redis* optireduce_redis_open(const char* url, const char* job_id,
                                        const char* run_id, int world_size,
                                        int64_t timeout_ms, int64_t connect_timeout_ms);
// Finishes (last rank deletes the run's keys) and disconnects.
int optireduce_redis_close(optireduce_redis* h);
int optireduce_redis_set(optireduce_redis* h, const char* key, const void* value,
                         size_t len);
// Waits up to timeout_ms for the key; *value is malloc'd (free with optireduce_free).
int optireduce_redis_get(optireduce_redis* h, const char* key, int64_t timeout_ms,
                         void** value, size_t* len);
int optireduce_redis_add(optireduce_redis* h, const char* key, int64_t delta,
                         int64_t* result);
int optireduce_redis_compare_set(optireduce_redis* h, const char* key, const void* expected,
                                 size_t expected_len, const void* desired,
                                 size_t desired_len, void** value, size_t* len);
// keys: an array of n NUL-terminated strings. *result = 1 when all exist.
int optireduce_redis_check(optireduce_redis* h, const char* const* keys, size_t n,
                           int* result);
int optireduce_redis_wait(optireduce_redis* h, const char* const* keys, size_t n,
                          int64_t timeout_ms);
int optireduce_redis_delete_key(optireduce_redis* h, const char* key, int* existed);
int optireduce_redis_num_keys(optireduce_redis* h, int64_t* result);

#ifdef __cplusplus
}
#endif
