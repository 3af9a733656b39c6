#include "redis/io_thread.h"

namespace ratelimit::redis {

IoThread::IoThread()
    : work_(boost::asio::make_work_guard(context_)), thread_([this] { context_.run(); }) {}

IoThread::~IoThread() {
  work_.reset();
  thread_.join();
}

}  // namespace ratelimit::redis
