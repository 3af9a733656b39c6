// compile-as: src/policy/policy.cc
// expect: 'store/over_limit_cache.h' file not found
// The policy module may not see the store's internals (nor the store at all).
#include "store/over_limit_cache.h"
