// A stand-in for the driver's libcuda.so.1, built by the tests: cuInit
// answers like the real one on a node without a GPU, and tells a wrong
// flags argument apart. Built with -DNO_CUINIT it lacks the symbol.

#ifndef NO_CUINIT
int cuInit(unsigned int flags) {
	return flags == 0 ? 100 /* CUDA_ERROR_NO_DEVICE */ : 1 /* CUDA_ERROR_INVALID_VALUE */;
}
#endif

int cuDriverGetVersion(int *version) {
	*version = 12020;
	return 0;
}
