#include "core/completion_batch.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

namespace ratelimit::core {
namespace {

TEST(CompletionBatch, WithoutABatchNothingIsDeferred) {
  bool ran = false;
  EXPECT_FALSE(CompletionBatch::Defer([&] { ran = true; }));
  EXPECT_FALSE(ran);  // dropped: the caller does the work itself
}

TEST(CompletionBatch, DeferredWorkRunsInOrderWhenTheOutermostBatchEnds) {
  std::string log;
  {
    CompletionBatch outer;
    EXPECT_TRUE(CompletionBatch::Defer([&] { log += "a"; }));
    {
      CompletionBatch inner;
      EXPECT_TRUE(CompletionBatch::Defer([&] { log += "b"; }));
    }
    EXPECT_EQ(log, "");  // the inner batch's end is not the batch's end
    log += "-";
  }
  EXPECT_EQ(log, "-ab");
  EXPECT_FALSE(CompletionBatch::Defer([] {}));  // closed again
}

TEST(CompletionBatch, WorkDeferredByDeferredWorkJoinsTheSameRun) {
  std::string log;
  {
    CompletionBatch batch;
    CompletionBatch::Defer([&] {
      log += "a";
      EXPECT_TRUE(CompletionBatch::Defer([&] { log += "c"; }));
    });
    CompletionBatch::Defer([&] { log += "b"; });
  }
  EXPECT_EQ(log, "abc");
}

TEST(CompletionBatch, ABatchIsItsThreadsOnly) {
  CompletionBatch batch;
  bool deferred_elsewhere = true;
  std::thread([&] { deferred_elsewhere = CompletionBatch::Defer([] {}); }).join();
  EXPECT_FALSE(deferred_elsewhere);
}

}  // namespace
}  // namespace ratelimit::core
