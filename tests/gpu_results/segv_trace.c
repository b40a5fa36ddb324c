/* Debug aid for GPU sessions (not part of the library): LD_PRELOAD it to print, on SIGSEGV,
 * each return address as "object+offset" so addr2line can name the line. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void on_segv(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  void *frames[64];
  int n = backtrace(frames, 64);
  fprintf(stderr, "SEGV sig=%d addr=%p\n", sig, si->si_addr);
  for (int i = 0; i < n; i++) {
    Dl_info d;
    if (dladdr(frames[i], &d) && d.dli_fname)
      fprintf(stderr, "  #%d %s+0x%lx %s\n", i, d.dli_fname, (unsigned long)((char *)frames[i] - (char *)d.dli_fbase),
              d.dli_sname ? d.dli_sname : "");
  }
  _exit(139);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, NULL);
}
