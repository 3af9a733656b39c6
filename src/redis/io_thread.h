// IoThread: an io_context with its own thread, for running clients without an
// event loop of your own (tools, tests, embedders).
//
//   IoThread io;                                  // thread starts here
//   Client client(io.executor(), options);
//   ...                                           // destroy clients before io
//
// Ownership: owns the io_context and the thread. The destructor lets queued
// work finish (clients must be destroyed or closed first, or they keep it
// alive by reconnecting) and joins the thread.
// Thread-safety: executor() and IsCurrentThread() may be called from any thread.
#pragma once

#include <thread>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

namespace ratelimit::redis {

class IoThread {
 public:
  IoThread();
  ~IoThread();
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  boost::asio::io_context& context() { return context_; }
  boost::asio::any_io_executor executor() { return context_.get_executor(); }
  // True iff called from the thread running the io_context.
  bool IsCurrentThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  boost::asio::io_context context_{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
};

}  // namespace ratelimit::redis
