// last_error.cpp: tq_last_error, kept per host thread.
#include "last_error.h"

#include <cstdarg>
#include <cstdio>

namespace {
thread_local char last_error[512] = "";
}

namespace tq {

tq_status fail(tq_status status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(last_error, sizeof(last_error), format, args);
  va_end(args);
  return status;
}

}  // namespace tq

extern "C" const char* tq_last_error(void) { return last_error; }
