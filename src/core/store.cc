#include "ratelimit/store.h"

#include <future>
#include <random>

namespace ratelimit {
namespace {

template <typename Call>
StatusOr<CheckResult> Wait(Call&& call) {
  std::promise<StatusOr<CheckResult>> p;
  auto f = p.get_future();
  call([&p](StatusOr<CheckResult> r) { p.set_value(std::move(r)); });
  return f.get();
}

}  // namespace

StatusOr<CheckResult> Store::CheckSync(const CheckRequest& request) {
  return Wait([&](CheckCallback cb) { Check(request, std::move(cb)); });
}

StatusOr<CheckResult> Store::PeekSync(const CheckRequest& request) {
  return Wait([&](CheckCallback cb) { Peek(request, std::move(cb)); });
}

Status Store::ResetSync(std::string_view key, std::span<const Limit* const> limits) {
  std::promise<Status> p;
  auto f = p.get_future();
  Reset(key, limits, [&p](Status s) { p.set_value(std::move(s)); });
  return f.get();
}

StatusOr<CheckResult> Store::SettleSync(const SettleRequest& request) {
  return Wait([&](CheckCallback cb) { Settle(request, std::move(cb)); });
}

void Store::SharedSecret(std::function<void(StatusOr<std::string>)> done) {
  static const std::string kSecret = [] {
    std::random_device rd;
    std::string s(32, '\0');
    for (char& c : s) c = static_cast<char>(rd());
    return s;
  }();
  done(kSecret);
}

void Store::SecretAccepting(std::function<bool(std::string_view)> /*accepts*/,
                            std::function<void(StatusOr<std::string>)> done) {
  SharedSecret(std::move(done));
}

Status ValidateSettle(const SettleRequest& request, size_t max_key_length) {
  if (Status s = ValidateKey(request.key, max_key_length); !s.ok()) return s;
  const auto& list = request.settlements;
  if (!request.once.empty() && (request.once.size() > 128 || request.once_ttl.count() <= 0 ||
                                request.once_ttl.count() > Limit::kMaxWindowMicros)) {
    return InvalidArgument("a settlement's once id is 1..128 bytes with a ttl of up to 366 days");
  }
  if (list.empty()) return InvalidArgument("a settlement needs at least one limit");
  if (list.size() > kMaxChecksPerRequest) {
    return InvalidArgument("a settlement may name at most " + std::to_string(kMaxChecksPerRequest) +
                           " limits, got " + std::to_string(list.size()));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].limit == nullptr)
      return InvalidArgument("limit " + std::to_string(i) + " is missing");
    if (!list[i].limit->settleable()) {
      if (list[i].limit->calendar() != nullptr) {
        return InvalidArgument("limit '" + list[i].limit->name() +
                               "' is a calendar quota, which cannot be settled (settle on a "
                               "bucket or a window aligned to the epoch)");
      }
      return InvalidArgument("limit '" + list[i].limit->name() +
                             "' is a sliding log, which cannot be settled (use a bucket or a "
                             "window for costs known afterwards)");
    }
    if (list[i].delta < -kMaxSettleDelta || list[i].delta > kMaxSettleDelta) {
      return InvalidArgument("a settlement's difference must be within +-" +
                             std::to_string(kMaxSettleDelta) + ", got " +
                             std::to_string(list[i].delta));
    }
    for (size_t j = 0; j < i; ++j) {
      if (list[j].limit->name() == list[i].limit->name()) {
        return InvalidArgument("limit '" + list[i].limit->name() +
                               "' appears twice in one settlement");
      }
    }
  }
  return Status::Ok();
}

Status ValidateKey(std::string_view key, size_t max_key_length, std::string_view what) {
  if (key.empty()) return InvalidArgument(std::string(what) + " must not be empty");
  if (key.size() > max_key_length) {
    return InvalidArgument(std::string(what) + " is " + std::to_string(key.size()) +
                           " bytes; the maximum is " + std::to_string(max_key_length));
  }
  return Status::Ok();
}

Status ValidateRequest(const CheckRequest& request, size_t max_key_length) {
  if (Status s = ValidateKey(request.key, max_key_length); !s.ok()) return s;
  if (request.checks.empty()) return InvalidArgument("a request needs at least one limit");
  if (request.checks.size() > kMaxChecksPerRequest) {
    return InvalidArgument("a request may check at most " + std::to_string(kMaxChecksPerRequest) +
                           " limits, got " + std::to_string(request.checks.size()));
  }
  for (size_t i = 0; i < request.checks.size(); ++i) {
    const LimitCheck& c = request.checks[i];
    if (c.limit == nullptr) return InvalidArgument("limit " + std::to_string(i) + " is missing");
    if (Status s = c.limit->ValidateCost(c.cost); !s.ok()) return s;
    for (size_t j = 0; j < i; ++j) {
      if (request.checks[j].limit->name() == c.limit->name()) {
        return InvalidArgument("limit '" + c.limit->name() + "' appears twice in one request");
      }
    }
  }
  return Status::Ok();
}

std::string_view FailureModeName(FailureMode m) {
  switch (m) {
    case FailureMode::kOpen: return "open";
    case FailureMode::kClosed: return "closed";
    case FailureMode::kLocal: return "local";
    case FailureMode::kError: return "error";
  }
  return "error";
}

StatusOr<FailureMode> ParseFailureMode(std::string_view name) {
  for (FailureMode m :
       {FailureMode::kOpen, FailureMode::kClosed, FailureMode::kLocal, FailureMode::kError}) {
    if (FailureModeName(m) == name) return m;
  }
  return InvalidArgument("unknown failure mode '" + std::string(name) +
                         "' (expected open, closed, local or error)");
}

}  // namespace ratelimit
