/* LD_PRELOADed into fuzz workers: on a fatal signal, print the native stack
 * (catchsegv style) to stderr, so every crash arrives with the libraries and
 * offsets it went through without a debugger run.  Python's faulthandler,
 * installed later, runs first, dumps the Python frames, restores this
 * handler and re-raises: the stack printed here then still holds the
 * crash site below the two signal frames.
 *
 * Built at test time: gcc -O1 -shared -fPIC crash_trace.c -o libcrash_trace.so
 */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

static void say(const char* text) {
  ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
  (void)ignored;
}

static void on_fatal(int sig) {
  void* frames[64];
  say("=== native backtrace (signal ");
  const char* name = strsignal(sig);
  say(name ? name : "?");
  say(")\n");
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  say("=== end native backtrace\n");
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  /* A stack overflow leaves no stack to run the handler on. */
  static char alt[1 << 16];
  stack_t ss;
  memset(&ss, 0, sizeof(ss));
  ss.ss_sp = alt;
  ss.ss_size = sizeof(alt);
  sigaltstack(&ss, NULL);
  /* backtrace() loads libgcc_s on first use, which must not happen inside
   * a signal handler. */
  void* warm[1];
  backtrace(warm, 1);
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(kSignals[i], &sa, NULL);
  }
}
