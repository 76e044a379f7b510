// A stand-in for the driver's libnvidia-ml.so.1, built by the tests:
// nvmlInit_v2 answers like the real one without the kernel module, unless
// GPUINFO_FAKE_NVML_INIT asks for another code; nvmlShutdown answers 0 only
// after a successful init, so a test sees the probe pair them.

#include <stdlib.h>

static int initialized;

int nvmlInit_v2(void) {
	const char *rc = getenv("GPUINFO_FAKE_NVML_INIT");
	int code = rc != NULL ? atoi(rc) : 9; // NVML_ERROR_DRIVER_NOT_LOADED
	initialized = code == 0;
	return code;
}

int nvmlShutdown(void) {
	return initialized ? 0 : 1; // NVML_ERROR_UNINITIALIZED
}
