package main

/*
#include <signal.h>
#include <string.h>
#include <stddef.h>

// The host's SIGURG disposition before this library's Go runtime started:
// taken by a constructor that runs before the runtime's own (priority 101
// sorts before the runtime's unprioritised .init_array entry).
static struct sigaction shimHostURG;
static struct sigaction shimLibURG;
static int shimHostURGSaved;

__attribute__((constructor(101))) static void shimSaveHostURG(void) {
	if (sigaction(SIGURG, NULL, &shimHostURG) == 0) {
		shimHostURGSaved = 1;
	}
}

static void shimCall(const struct sigaction *sa, int sig, siginfo_t *info, void *ctx) {
	if (sa->sa_flags & SA_SIGINFO) {
		if (sa->sa_sigaction != NULL) {
			sa->sa_sigaction(sig, info, ctx);
		}
		return;
	}
	if (sa->sa_handler != SIG_DFL && sa->sa_handler != SIG_IGN && sa->sa_handler != NULL) {
		sa->sa_handler(sig);
	}
}

// shimChainURG gives every SIGURG to both runtimes. Each Go runtime uses
// SIGURG to preempt its own goroutines and takes a spurious one as a
// no-op, so calling both handlers loses neither runtime's preemption.
static void shimChainURG(int sig, siginfo_t *info, void *ctx) {
	shimCall(&shimLibURG, sig, info, ctx);
	shimCall(&shimHostURG, sig, info, ctx);
}

// shimChainHostURG installs the chain when the host had a handler of its
// own (a Go program: its runtime installs one at start); a C host keeps
// this runtime's handler alone. It returns 1 when it chained.
static int shimChainHostURG(void) {
	struct sigaction cur, chain;
	if (!shimHostURGSaved) {
		return 0;
	}
	if (!(shimHostURG.sa_flags & SA_SIGINFO) &&
	    (shimHostURG.sa_handler == SIG_DFL || shimHostURG.sa_handler == SIG_IGN)) {
		return 0;
	}
	if (sigaction(SIGURG, NULL, &cur) != 0) {
		return 0;
	}
	shimLibURG = cur;
	memset(&chain, 0, sizeof chain);
	chain.sa_sigaction = shimChainURG;
	chain.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
	sigfillset(&chain.sa_mask);
	return sigaction(SIGURG, &chain, NULL) == 0;
}
*/
import "C"

import "os"

// chainedURG tells whether SIGURG is chained to the host's runtime.
var chainedURG bool

// Two Go runtimes in one process (this library, dlopened by a Go program
// such as the kubelet plugin through go-nvml) each install signal
// handlers. This runtime, built with -buildmode=c-shared, installs its
// own only for the synchronous signals, SIGPIPE and SIGURG, and forwards
// synchronous signals and SIGPIPE that arrive outside its own goroutines
// to the handler it found (the host's). SIGURG, the preemption signal, it
// does not forward: a SIGURG the host's runtime sends to preempt one of
// its goroutines would be swallowed, and a host goroutine in a loop
// without calls could then hold up the host's garbage collector for good.
// So once this runtime is up, SIGURG goes to a small C handler that calls
// both. GPUAAS_NVMLSHIM_NO_SIGURG_CHAIN=1 leaves the runtime's default,
// for the test that shows why the chain is needed.
func init() {
	if os.Getenv("GPUAAS_NVMLSHIM_NO_SIGURG_CHAIN") == "1" {
		return
	}
	chainedURG = C.shimChainHostURG() == 1
}
