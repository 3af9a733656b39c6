// Callback: a move-only, type-erased `void(StatusOr<Reply>)` with inline storage.
//
// Every Redis call completes through exactly one Callback invocation. Unlike
// std::function it accepts move-only lambdas (e.g. capturing a std::promise)
// and stores lambdas of up to kInlineSize bytes without a heap allocation,
// which keeps the per-call cost of the client low.
//
//   Callback cb = [p = std::move(promise)](StatusOr<Reply> r) mutable { p.set_value(r); };
//   cb(Reply::Integer(1));
//
// Ownership: owns the wrapped callable. Thread-safety: none (a value type).
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

#include "ratelimit/status.h"
#include "redis/reply.h"

namespace ratelimit::redis {

class Callback {
 public:
  static constexpr size_t kInlineSize = 48;

  Callback() = default;
  Callback(std::nullptr_t) {}  // NOLINT

  template <typename F, typename D = std::decay_t<F>,
            typename = std::enable_if_t<!std::is_same_v<D, Callback> &&
                                        std::is_invocable_v<D&, StatusOr<Reply>>>>
  Callback(F&& f) {                            // NOLINT: implicit, like std::function
    if constexpr (sizeof(D) <= kInlineSize &&  // NOLINT(misc-redundant-expression)
                  alignof(D) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<D>) {
      ::new (static_cast<void*>(storage_)) D(std::forward<F>(f));
      ops_ = &kInlineOps<D>;
    } else {
      *reinterpret_cast<D**>(storage_) = new D(std::forward<F>(f));
      ops_ = &kHeapOps<D>;
    }
  }

  Callback(Callback&& other) noexcept { MoveFrom(other); }
  Callback& operator=(Callback&& other) noexcept {
    if (this != &other) {
      Reset();
      MoveFrom(other);
    }
    return *this;
  }
  Callback(const Callback&) = delete;
  Callback& operator=(const Callback&) = delete;
  ~Callback() { Reset(); }

  explicit operator bool() const { return ops_ != nullptr; }

  // REQUIRES: *this holds a callable.
  void operator()(StatusOr<Reply> result) { ops_->invoke(storage_, std::move(result)); }

  void Reset() {
    if (ops_ != nullptr) {
      ops_->destroy(storage_);
      ops_ = nullptr;
    }
  }

 private:
  struct Ops {
    void (*invoke)(void* storage, StatusOr<Reply>&& result);
    void (*move)(void* dst, void* src);  // move-constructs dst from src, destroys src
    void (*destroy)(void* storage);
  };

  template <typename D>
  static constexpr Ops kInlineOps = {
      [](void* s, StatusOr<Reply>&& r) { (*static_cast<D*>(s))(std::move(r)); },
      [](void* dst, void* src) {
        ::new (dst) D(std::move(*static_cast<D*>(src)));
        static_cast<D*>(src)->~D();
      },
      [](void* s) { static_cast<D*>(s)->~D(); },
  };
  template <typename D>
  static constexpr Ops kHeapOps = {
      [](void* s, StatusOr<Reply>&& r) { (**static_cast<D**>(s))(std::move(r)); },
      [](void* dst, void* src) { *static_cast<D**>(dst) = *static_cast<D**>(src); },
      [](void* s) { delete *static_cast<D**>(s); },
  };

  void MoveFrom(Callback& other) noexcept {
    if (other.ops_ != nullptr) {
      other.ops_->move(storage_, other.storage_);
      ops_ = other.ops_;
      other.ops_ = nullptr;
    }
  }

  alignas(std::max_align_t) unsigned char storage_[kInlineSize];
  const Ops* ops_ = nullptr;
};

}  // namespace ratelimit::redis
