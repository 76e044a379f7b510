package catalog

// Exported for the tests of package catalog_test.
var (
	OwnedBy             = ownedBy
	ReleaseFinalizersAt = releaseFinalizers
)
