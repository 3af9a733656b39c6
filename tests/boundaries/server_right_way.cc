// compile-as: src/server/headers.cc
// expect: ok
// The control: what the server may include compiles with the same flags, so
// the failures above are the boundaries and not broken flags.
#include "core/ascii.h"
#include "policy/config.h"
#include "ratelimit/memory_store.h"
#include "ratelimit/redis_store.h"
#include "server/headers.h"
