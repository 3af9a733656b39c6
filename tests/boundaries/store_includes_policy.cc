// compile-as: src/store/memory_store.cc
// expect: 'policy/config.h' file not found
// Dependencies point one way: the store knows nothing of the config.
#include "policy/config.h"
