// compile-as: src/store/token_prefetch.cc
// expect: reading variable 'total_' requires holding mutex 'mu_'
// Clang's thread-safety analysis is on (-Wthread-safety -Werror): a guarded
// member read without its mutex does not compile.
#include "ratelimit/thread_annotations.h"

class Counter {
 public:
  int Read() const { return total_; }

 private:
  mutable ratelimit::Mutex mu_;
  int total_ RL_GUARDED_BY(mu_) = 0;
};

int ReadCounter(const Counter& c) { return c.Read(); }
