// CompletionBatch: a scope in which one event completes several calls at
// once (a read from Redis brings the replies of a batch of checks), so that
// whoever answers those calls can do its per-answer work once for all of
// them, at the scope's end, on the same thread: the gRPC server writes the
// answers of one connection with one `sendto` instead of one each, and
// nothing waits for a turn of the event loop.
//
//   {
//     core::CompletionBatch batch;       // the producer (redis::Connection)
//     for (auto& c : completions) c();   // ... each may call Defer
//   }                                    // the deferred work runs here, in order
//
//   // A consumer, per answer:
//   if (!flush_deferred && core::CompletionBatch::Defer([this] { Flush(); }))
//     flush_deferred = true;             // (it clears the flag in Flush)
//   else if (!flush_deferred) Flush();
//
// Batches nest; the outermost runs what was deferred (work deferred while
// it runs joins the same run). Thread-safety: per thread (thread_local).
#pragma once

#include <functional>
#include <vector>

namespace ratelimit::core {

class CompletionBatch {
 public:
  CompletionBatch() { ++State().depth; }
  ~CompletionBatch() {
    Batch& b = State();
    if (b.depth > 1) {
      --b.depth;
      return;
    }
    // Still open while the deferred work runs: what it defers joins this run.
    for (size_t i = 0; i < b.deferred.size(); ++i) {
      std::function<void()> fn = std::move(b.deferred[i]);
      fn();
    }
    b.deferred.clear();
    --b.depth;
  }
  CompletionBatch(const CompletionBatch&) = delete;
  CompletionBatch& operator=(const CompletionBatch&) = delete;

  // Queues `fn` to run at the end of the batch open on this thread; false
  // (and `fn` dropped) when none is open: then the caller does it now.
  static bool Defer(std::function<void()> fn) {
    Batch& b = State();
    if (b.depth == 0) return false;
    b.deferred.push_back(std::move(fn));
    return true;
  }

 private:
  struct Batch {
    int depth = 0;
    std::vector<std::function<void()>> deferred;
  };
  static Batch& State() {
    thread_local Batch batch;
    return batch;
  }
};

}  // namespace ratelimit::core
