// compile-as: src/core/limit.cc
// expect: 'store/hash.h' file not found
// The core depends on the standard library only.
#include "store/hash.h"
