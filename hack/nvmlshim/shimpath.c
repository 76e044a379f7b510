#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

// shimPath is the path this library was loaded from, NULL if unknown.
const char *shimPath(void) {
	Dl_info info;
	if (dladdr((void *)shimPath, &info) == 0) {
		return NULL;
	}
	return info.dli_fname;
}
