// compile-as: src/server/headers.cc
// expect: 'redis/client.h' file not found
// Only the store speaks to Redis; the server does not link rl_redis.
#include "redis/client.h"
