// RL_RETURN_IF_ERROR(expr): returns the Status of `expr` from the enclosing
// function when it is not OK, for code that checks many steps in a row (the
// config loaders: policy/config.cc, envoy/config.cc).
//
//   Status Load(const Node& n) {
//     RL_RETURN_IF_ERROR(CheckMap(n, "store", {"type", "url"}));
//     ...
//   }
#pragma once

#include "ratelimit/status.h"

#define RL_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    if (::ratelimit::Status _s = (expr); !_s.ok()) { \
      return _s;                                     \
    }                                                \
  } while (false)
