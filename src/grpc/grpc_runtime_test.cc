// The process-wide settings the gRPC face makes to the runtime it links.
#include <gtest/gtest.h>

#include <absl/synchronization/mutex.h>

#include "grpc/grpc_face.h"

namespace {

// Two mutexes taken in one order, then in the other: a lock-order inversion
// (no deadlock: one thread), which Abseil's deadlock detector reports.
void InvertLockOrder() {
  absl::Mutex a, b;
  a.Lock();
  b.Lock();
  b.Unlock();
  a.Unlock();
  b.Lock();
  a.Lock();
  a.Unlock();
  b.Unlock();
}

// Why the face turns it off: Debian's Abseil (built without NDEBUG) has the
// detector on, in its abort mode. In a child process (a death test), with
// Abseil's default; if a future Abseil package turns it off, this test says
// so and the call in GrpcFace::Start can go.
TEST(GrpcRuntimeDeathTest, DebiansAbseilRunsTheDeadlockDetector) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(InvertLockOrder(), "[Dd]eadlock");
}

TEST(GrpcRuntime, TheFaceTurnsAbseilsDeadlockDetectorOff) {
  ratelimit::grpcface::DisableAbseilDeadlockDetection();
  InvertLockOrder();  // aborts the process if the detector is still on
  ratelimit::grpcface::DisableAbseilDeadlockDetection();  // idempotent
  InvertLockOrder();
}

}  // namespace
