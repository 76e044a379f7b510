package nvdev

// SetOpen replaces what OpenWhenReady opens with; it returns the function
// that puts Open back.
func SetOpen(f func(Options) (Interface, error)) (restore func()) {
	openFunc = f
	return func() { openFunc = Open }
}
