// compile-as: src/store/redis_store.cc
// expect: 'redis/cluster_slots.h' file not found
// The slot map's parser is ClusterClient's own, not part of rl_redis' interface.
#include "redis/cluster_slots.h"
