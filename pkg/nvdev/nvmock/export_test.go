package nvmock

// SetBeforeStateRename makes every state write call f after writing and
// syncing the temporary file and before renaming it into place: where a
// kill leaves a complete new file beside the old state. It returns the
// function that removes the hook.
func SetBeforeStateRename(f func()) (restore func()) {
	beforeStateRename = f
	return func() { beforeStateRename = nil }
}
