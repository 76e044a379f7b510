// Package admission decides on new ResourceClaims and keeps the quota
// books: the Accountant prices claims (pkg/quota), sums each tenant's and
// cohort's usage from the informer cache, and reserves what it admits in
// the ledger every replica shares until the cache shows the claim. A
// reservation's lifecycle is one rule (reservation.go); cohort totals are
// kept running (cohort.go); a lender refused while its quota is on loan
// reclaims it (reclaim.go); a replica whose cache lags waits for what
// another settled (cacheprogress.go); the leader sweeps unused books
// (booksweep.go).
//
// It is one package, not books and admission apart: a decision holds a
// cohort's lock from the sync of its running total to the verdict, groups
// the book writes of concurrent admissions, and reclaims from the book it
// has just written, so the two share every lock and type.
//
// What crosses to the rest of the controller: Admit (the verdict,
// Admission), KueueGate.Overrule for a claim the quota denied, the Nudger
// of the pods waiting for quota, Watch (the informer hooks), Report and
// NamespaceOwner for the quota reconciler, ProfileDevices for the catalog,
// and PublishedMigProfiles, HeldByOthers and ForeignClasses for the
// webhooks.
package admission
