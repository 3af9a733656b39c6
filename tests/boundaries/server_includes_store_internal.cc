// compile-as: src/server/headers.cc
// expect: 'store/shard_mutex.h' file not found
// The server uses the stores through include/ratelimit/, never their internals.
#include "store/shard_mutex.h"
