package nvmock

// SetRoot makes the mock's memory limits see the caller as root or not;
// it returns the function that restores the real check.
func SetRoot(root bool) (restore func()) {
	old := mockIsRoot
	mockIsRoot = func() bool { return root }
	return func() { mockIsRoot = old }
}
